// Unit tests of the feeder's state: fill order, the both-edges-back slot rule, protocol errors.
#include "actors/feed_state.hpp"

#include <doctest/doctest.h>

using namespace dsa::actors;

TEST_CASE(
    "feed state: fills in (step, micro-batch) order, one at a time, into the lowest free slot") {
  feed_state feed(2, 2, 2, 7);
  auto a = feed.start_fill();
  REQUIRE(a);
  CHECK(!feed.start_fill()); // one fill at a time
  CHECK(feed.on_filled().slot == a->slot);
  auto b = feed.start_fill();
  REQUIRE(b);
  feed.on_filled();
  CHECK((a->step == 7 && a->micro_batch == 0 && a->slot == 0));
  CHECK((b->step == 7 && b->micro_batch == 1 && b->slot == 1));
  CHECK(!feed.start_fill()); // both slots out
  CHECK(feed.free_slots() == 0);
}

TEST_CASE("feed state: a slot is free again only once its input and its labels came back") {
  feed_state feed(2, 3, 1, 0);
  for (int i = 0; i < 2; ++i) {
    REQUIRE(feed.start_fill());
    feed.on_filled();
  }
  CHECK(!feed.done());
  REQUIRE(feed.on_released(feed_edge::input, 1).has_value());
  REQUIRE(feed.on_released(feed_edge::input, 0).has_value());
  CHECK(!feed.start_fill()); // labels still out at the last stage
  REQUIRE(feed.on_released(feed_edge::labels, 1).has_value());
  auto next = feed.start_fill();
  REQUIRE(next);
  CHECK((next->micro_batch == 2 && next->slot == 1));
  feed.on_filled();
  CHECK(feed.done());
  REQUIRE(feed.on_released(feed_edge::labels, 0).has_value());
  CHECK(!feed.start_fill()); // every micro-batch of the run was filled
  CHECK(feed.free_slots() == 1);
}

TEST_CASE("feed state: a release of a slot that is not out, or out of range, is a protocol error") {
  feed_state feed(2, 4, 1, 0);
  REQUIRE(feed.start_fill());
  feed.on_filled();
  auto twice = feed.on_released(feed_edge::input, 0);
  REQUIRE(twice.has_value());
  twice = feed.on_released(feed_edge::input, 0);
  REQUIRE(!twice.has_value());
  CHECK(twice.err().message.find("input slot 0 released but not out") != std::string::npos);
  auto never = feed.on_released(feed_edge::labels, 1);
  REQUIRE(!never.has_value());
  CHECK(never.err().message.find("labels slot 1") != std::string::npos);
  auto range = feed.on_released(feed_edge::labels, 2);
  REQUIRE(!range.has_value());
  CHECK(range.err().message.find("has 2 slots") != std::string::npos);
}
