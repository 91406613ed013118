// Ending a thread's OpenMP pool (kernels/cpu/openmp_threads.hpp).
#include "kernels/cpu/openmp_threads.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <thread>

namespace {

int threads_in_process() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

} // namespace

TEST_CASE("release_openmp_threads ends the calling thread's pool and a later region starts one") {
  int before = 0, with_pool = 0, after = 0, again = 0;
  bool released = false, inside = true;
  std::atomic<int> ran{0};
  // On a thread of its own, so that the pool is this thread's alone (the runner's main
  // thread keeps whatever earlier tests started).
  std::thread t([&] {
    before = threads_in_process();
#pragma omp parallel num_threads(2)
    ran.fetch_add(1);
    with_pool = threads_in_process();
#pragma omp parallel num_threads(2)
    {
#pragma omp master
      inside = dsa::cpu::release_openmp_threads(); // refused inside a region
    }
    released = dsa::cpu::release_openmp_threads();
    after = threads_in_process();
#pragma omp parallel num_threads(2)
    ran.fetch_add(1);
    again = threads_in_process();
    dsa::cpu::release_openmp_threads();
  });
  t.join();
  CHECK(ran.load() == 4);
  CHECK(with_pool == before + 1); // the team's second thread, kept after the region
  CHECK_FALSE(inside);
  CHECK(released);
  CHECK(after == before); // joined before the call returned
  CHECK(again == before + 1);
}
