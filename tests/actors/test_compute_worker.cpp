// The compute worker's OpenMP pool: ended when a worker that releases runs out of jobs,
// kept by a stage's worker (actors/compute_worker.hpp).
#include "actors/compute_worker.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <future>

namespace {

int threads_in_process() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// Runs a job on the worker and returns what it computed, once it has run.
template <class Fn>
auto run_on(dsa::actors::compute_worker& w, Fn fn) {
  std::promise<decltype(fn())> p;
  auto f = p.get_future();
  w.post([&] { p.set_value(fn()); });
  return f.get();
}

// The process's thread count with (and, on a second job, after) a job that starts a region
// of two threads: the second job is posted once the worker has gone idle after the first.
std::pair<int, int> threads_during_and_after(dsa::actors::compute_worker& w) {
  const int during = run_on(w, [] {
    int n = 0;
#pragma omp parallel num_threads(2)
    {
#pragma omp master
      n = threads_in_process();
    }
    return n;
  });
  w.wait_until_idle();
  const int after = run_on(w, [] { return threads_in_process(); });
  return {during, after};
}

} // namespace

TEST_CASE("compute_worker: a worker that releases ends its OpenMP pool when it runs out of jobs") {
  dsa::actors::compute_worker w; // release_when_idle by default
  const int idle = run_on(w, [] { return threads_in_process(); });
  const auto [during, after] = threads_during_and_after(w);
  CHECK(during == idle + 1);
  CHECK(after == idle);
  w.wait_until_idle(); // with nothing queued it returns at once
}

TEST_CASE("compute_worker: jobs posted back to back keep the pool until the queue empties") {
  dsa::actors::compute_worker w;
  const int idle = run_on(w, [] { return threads_in_process(); });
  // The first job posts the second itself, so the queue is never empty between them.
  std::promise<int> second;
  auto got = second.get_future();
  std::atomic<int> ran{0};
  w.post([&] {
#pragma omp parallel num_threads(2)
    ran.fetch_add(1);
    w.post([&] { second.set_value(threads_in_process()); });
  });
  CHECK(got.get() == idle + 1);
  CHECK(ran.load() == 2);
  w.wait_until_idle();
  CHECK(run_on(w, [] { return threads_in_process(); }) == idle);
}

TEST_CASE("compute_worker: a stage's worker keeps its OpenMP pool between jobs") {
  dsa::actors::compute_worker w(dsa::actors::openmp_threads::keep);
  const int idle = run_on(w, [] { return threads_in_process(); });
  const auto [during, after] = threads_during_and_after(w);
  CHECK(during == idle + 1);
  CHECK(after == idle + 1);
}
