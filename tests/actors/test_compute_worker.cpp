// The compute worker's OpenMP pool: ended when a worker that releases has no job for a
// while, kept by a stage's worker (actors/compute_worker.hpp).
#include "actors/compute_worker.hpp"
#include "tests/support/threads.hpp"

#include <doctest/doctest.h>

#include <omp.h>

#include <future>

namespace {

// Runs a job on the worker and returns what it computed, once it has run.
template <class Fn>
auto run_on(dsa::actors::compute_worker& w, Fn fn) {
  std::promise<decltype(fn())> p;
  auto f = p.get_future();
  w.post([&] { p.set_value(fn()); });
  return f.get();
}

// A region of two threads on the worker: its second thread's id (0 if the runtime gave one).
pid_t team_thread_of(dsa::actors::compute_worker& w) {
  return run_on(w, [] { return dsa::test::openmp_team_thread(); });
}

} // namespace

TEST_CASE("compute_worker: a worker that releases ends its OpenMP pool when it runs out of jobs") {
  dsa::actors::compute_worker w; // release_when_idle by default
  const pid_t team = team_thread_of(w);
  REQUIRE(team != 0);
  w.wait_until_idle(); // returns once the pool is released
  CHECK(dsa::test::thread_gone(team));
  CHECK(team_thread_of(w) != 0); // a new pool for the next job
}

TEST_CASE("compute_worker: a job within the grace keeps the pool; the destructor ends the grace wait") {
  // An hour's grace: the second job, posted from here after the first has finished, comes
  // within it, so it finds the same team thread. The worker is then destroyed during that
  // grace wait, which must end at once (the test would hang for an hour otherwise).
  dsa::actors::compute_worker w(dsa::actors::openmp_threads::release_when_idle, std::chrono::hours(1));
  const pid_t team = team_thread_of(w);
  REQUIRE(team != 0);
  CHECK(team_thread_of(w) == team);
}

TEST_CASE("compute_worker: a stage's worker keeps its OpenMP pool between jobs") {
  dsa::actors::compute_worker w(dsa::actors::openmp_threads::keep);
  const pid_t team = team_thread_of(w);
  REQUIRE(team != 0);
  w.wait_until_idle();
  CHECK(dsa::test::thread_listed(team));
  CHECK(team_thread_of(w) == team); // the same team thread again
}

TEST_CASE("compute_worker: jobs posted back to back keep the pool until the queue empties") {
  dsa::actors::compute_worker w;
  // The first job posts the second itself, so the queue is never empty between them.
  std::promise<pid_t> first_team, second_team;
  auto first = first_team.get_future(), second = second_team.get_future();
  w.post([&] {
    pid_t tid = 0;
#pragma omp parallel num_threads(2)
    {
      if (omp_get_thread_num() == 1) tid = dsa::test::thread_id();
    }
    first_team.set_value(tid);
    w.post([&] {
      pid_t again = 0;
#pragma omp parallel num_threads(2)
      {
        if (omp_get_thread_num() == 1) again = dsa::test::thread_id();
      }
      second_team.set_value(again);
    });
  });
  const pid_t a = first.get(), b = second.get();
  REQUIRE(a != 0);
  CHECK(b == a);
  w.wait_until_idle();
  CHECK(dsa::test::thread_gone(a));
}
