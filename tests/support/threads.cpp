// See threads.hpp.
#include "tests/support/threads.hpp"

#include <omp.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include <unistd.h>

namespace dsa::test {

pid_t thread_id() { return ::gettid(); }

bool thread_listed(pid_t tid) { return std::filesystem::exists("/proc/self/task/" + std::to_string(tid)); }

pid_t openmp_team_thread() {
  pid_t tid = 0;
  int size = 0;
#pragma omp parallel num_threads(2)
  {
    if (omp_get_thread_num() == 1) tid = thread_id();
    if (omp_get_thread_num() == 0) size = omp_get_num_threads();
  }
  return size == 2 ? tid : 0;
}

bool thread_gone(pid_t tid) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (thread_listed(tid)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

} // namespace dsa::test
