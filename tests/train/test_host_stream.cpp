// The bookkeeping of a whole shard's update streamed over the backward
// (actors/train/shard/host_stream.hpp): parameters updated last first, none before the
// parts cover it, parts of another step ignored, a cancelled run's waiting update thrown
// out, the streamed step taken once, and the counts of the end-of-run line; the
// gradient_frontier it and the NVMe update stream share.
#include "actors/train/shard/host_stream.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace dsa;

TEST_CASE("host_stream: each parameter updated once, last first, only after its part is final") {
  train::host_stream s(3, 5);
  std::atomic<std::uint32_t> covered{5}; // what gradients_final has said so far
  std::vector<std::size_t> order;
  std::vector<std::uint32_t> covered_at;
  const auto started = std::chrono::steady_clock::now();
  auto run = std::async(std::launch::async, [&] {
    return s.run(7, started, [&](std::size_t i) {
      order.push_back(i);
      covered_at.push_back(covered.load());
    });
  });
  s.gradients_final(6, 0); // another step's part: ignored by step 7's update
  for (std::uint32_t first : {3u, 1u, 0u}) {
    covered = first;
    s.gradients_final(7, first);
  }
  run.get();
  CHECK(order == std::vector<std::size_t>{4, 3, 2, 1, 0});
  for (std::size_t k = 0; k < order.size(); ++k) {
    CAPTURE(k);
    CHECK(covered_at[k] <= order[k]); // updated only once covered
  }
  CHECK(s.take(7));
  CHECK_FALSE(s.take(7)); // taken once
  const std::string line = s.report();
  CAPTURE(line);
  CHECK(line.rfind("stage 3 optimizer in host memory: 1 updates streamed over the backward, ", 0) == 0);
  CHECK(line.find(" of their 5 parameter updates began before") != std::string::npos);
}

TEST_CASE("host_stream: the parts of a step all in before the update: nothing waits, nothing early") {
  train::host_stream s(0, 3);
  s.gradients_final(2, 1);
  s.gradients_final(2, 0);
  std::vector<std::size_t> order;
  s.run(2, std::chrono::steady_clock::now(), [&](std::size_t i) { order.push_back(i); });
  CHECK(order == std::vector<std::size_t>{2, 1, 0});
  CHECK(s.report().find(": 1 updates streamed over the backward, 0 of their 3 parameter updates began before") !=
        std::string::npos);
  // The update of another step while the streamed one is not settled: a broken order, named.
  CHECK_THROWS_AS(s.take(3), std::logic_error);
  CHECK(s.take(2));
}

TEST_CASE("host_stream: a run that stops throws out the update waiting for parts; nothing streamed, no line") {
  train::host_stream s(1, 4);
  std::vector<std::size_t> order;
  auto run = std::async(std::launch::async, [&] {
    s.run(0, std::chrono::steady_clock::now(), [&](std::size_t i) { order.push_back(i); });
  });
  s.gradients_final(0, 3); // parameter 3 only: the update waits for parameter 2
  s.cancel();
  try {
    run.get();
    FAIL("the waiting update did not throw");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("the run stopped during the streamed update of step 0") != std::string::npos);
  }
  CHECK(order.size() <= 1); // parameter 3 may have been updated before the cancel
  CHECK_FALSE(s.take(0));
  CHECK(s.report().empty());
}

TEST_CASE("gradient_frontier: a suffix per step, reset by a new step; early until the last part; cancel ends waits") {
  train::gradient_frontier f;
  // Nothing told yet: nothing final.
  CHECK_FALSE(f.check(0, 9).final);
  f.advance(0, 7, 10, false); // units 7.. of step 0
  CHECK(f.check(0, 7).final);
  CHECK(f.check(0, 7).early);
  CHECK_FALSE(f.check(0, 6).final);
  CHECK_FALSE(f.check(1, 9).final); // another step
  f.advance(0, 8, 10, false);       // a later part of a suffix never shrinks it
  CHECK(f.check(0, 7).final);
  const auto before = std::chrono::steady_clock::now() - std::chrono::hours(1);
  CHECK(f.after_backward(before) == before); // the last part has not come
  f.advance(0, 0, 10, true);
  CHECK(f.check(0, 0).final);
  CHECK_FALSE(f.check(0, 0).early);
  CHECK(f.after_backward(before) > before); // from the last part's arrival
  // Step 1's first part resets the suffix.
  f.advance(1, 9, 10, false);
  CHECK(f.check(1, 9).final);
  CHECK_FALSE(f.check(1, 8).final);
  CHECK_FALSE(f.check(0, 0).final);
  // A wait for a unit told later returns once told; a cancel ends a wait that would not.
  std::chrono::steady_clock::duration waited{};
  std::thread teller([&] { f.advance(1, 3, 10, false); });
  const auto got = f.wait_final(1, 3, waited);
  teller.join();
  CHECK(got.final);
  CHECK_FALSE(got.cancelled);
  std::thread canceller([&] { f.cancel(); });
  const auto stopped = f.wait_final(1, 0, waited);
  canceller.join();
  CHECK(stopped.cancelled);
  CHECK_FALSE(stopped.final);
  CHECK(f.check(1, 5).cancelled);
}
