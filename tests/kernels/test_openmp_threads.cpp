// Ending a thread's OpenMP pool (kernels/cpu/openmp_threads.hpp).
#include "kernels/cpu/openmp_threads.hpp"
#include "tests/support/threads.hpp"

#include <doctest/doctest.h>

#include <omp.h>

#include <atomic>
#include <thread>
#include <vector>

using dsa::test::openmp_team_thread;

TEST_CASE("release_openmp_threads ends the calling thread's pool and a later region starts one") {
  pid_t first = 0, second = 0;
  bool kept = false, inside = true, released = false, gone = false, second_listed = false;
  // On a thread of its own, so that the pool is this thread's alone.
  std::thread t([&] {
    first = openmp_team_thread();
    kept = dsa::test::thread_listed(first); // the team's thread stays after the region
#pragma omp parallel num_threads(2)
    {
#pragma omp master
      inside = dsa::cpu::release_openmp_threads(); // refused inside a region
    }
    released = dsa::cpu::release_openmp_threads();
    gone = dsa::test::thread_gone(first);
    second = openmp_team_thread();
    second_listed = dsa::test::thread_listed(second);
    dsa::cpu::release_openmp_threads();
  });
  t.join();
  REQUIRE(first != 0);
  CHECK(kept);
  CHECK_FALSE(inside);
  CHECK(released);
  CHECK(gone);
  CHECK(second != 0);
  CHECK(second_listed);
}

TEST_CASE("release_openmp_threads leaves other threads' pools and regions alone") {
  // Thread A's region of two waits inside for B, which meanwhile starts and ends its own
  // pool 20 times; then A's threads fill their halves and both pools check out.
  constexpr int n = 1 << 12;
  std::vector<int> out(n, 0);
  std::atomic<bool> go{false};
  std::atomic<int> waiting{0}, a_size{0};
  pid_t a_team = 0;
  bool a_kept = false;
  std::thread a([&] {
#pragma omp parallel num_threads(2)
    {
      if (omp_get_thread_num() == 0) a_size.store(omp_get_num_threads());
      waiting.fetch_add(1);
      // Both of A's threads wait here for B (a team of one, under OMP_DYNAMIC or a thread
      // limit, does not: B then has nothing to wait for).
      while (omp_get_num_threads() == 2 && !go.load()) std::this_thread::yield();
      if (omp_get_thread_num() == 1) a_team = dsa::test::thread_id();
#pragma omp for schedule(static)
      for (int i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = i * 3 + omp_get_thread_num();
    }
    a_kept = a_team != 0 && dsa::test::thread_listed(a_team); // A's pool kept its thread through B's releases
  });
  int releases = 0;
  std::thread b([&] {
    while (a_size.load() == 0 || waiting.load() < a_size.load()) std::this_thread::yield(); // A is inside its region
    for (int r = 0; r < 20; ++r) {
      if (openmp_team_thread() != 0 && dsa::cpu::release_openmp_threads()) ++releases;
    }
    go.store(true);
  });
  b.join();
  a.join();
  CHECK(releases == 20);
  REQUIRE(a_size.load() == 2);
  CHECK(a_kept);
  bool right = true;
  for (int i = 0; i < n; ++i) right = right && out[static_cast<std::size_t>(i)] == i * 3 + (i < n / 2 ? 0 : 1);
  CHECK(right);
}
