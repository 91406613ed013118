// The starvation rule on small hand-made traces (the injected fault in a real
// run's trace is in test_trace_check.cpp): a stage idle past the tolerance after
// the release of its output slot is credit starvation on that edge; a produced
// for later work does not excuse it; any release, or its own input, does.
#include "actors/trace/analysis/trace_starvation.hpp"

#include <doctest/doctest.h>

using namespace dsa::actors;

namespace {

constexpr std::uint32_t feeder = 0, stage0 = 1, stage1 = 2;
constexpr std::uint64_t ms = 1'000'000;

trace_record message(trace_kind kind, trace_name name, std::uint64_t t, std::uint32_t actor, std::uint32_t peer,
                     std::uint32_t edge, std::uint32_t slot, std::uint32_t step, std::uint32_t mb) {
  trace_record r;
  r.kind = static_cast<std::uint8_t>(kind);
  r.name = static_cast<std::uint16_t>(name);
  r.t0_ns = t;
  r.actor = actor;
  r.peer = peer;
  r.edge = edge;
  r.slot = slot;
  r.step = step;
  r.micro_batch = mb;
  return r;
}

trace_record forward(std::uint64_t t0, std::uint64_t t1, std::uint32_t mb) {
  trace_record r;
  r.kind = static_cast<std::uint8_t>(trace_kind::span);
  r.name = static_cast<std::uint16_t>(trace_name::forward);
  r.t0_ns = t0;
  r.t1_ns = t1;
  r.actor = stage0;
  r.stage = 0;
  r.micro_batch = mb;
  return r;
}

// Stage 0 runs forwards mb0 and mb1 into both slots of edge 2; stage 1 gives slot 0
// back at 20 ms; stage 0's forward mb2 (its input there since 12 ms) starts at `start`.
trace_data held_forward(std::uint64_t start) {
  trace_data t;
  t.names = trace_name_table();
  t.actors = {"feeder", "stage 0", "stage 1"};
  t.info = {{"edge.0", "3 input"}, {"edge.2", "2 activation 0"}};
  using k = trace_kind;
  using n = trace_name;
  t.records = {message(k::recv, n::produced, 1 * ms, stage0, feeder, 0, 0, 0, 0),
               message(k::recv, n::produced, 2 * ms, stage0, feeder, 0, 1, 0, 1),
               forward(3 * ms, 5 * ms, 0),
               message(k::send, n::produced, 6 * ms, stage0, stage1, 2, 0, 0, 0),
               forward(7 * ms, 9 * ms, 1),
               message(k::send, n::produced, 10 * ms, stage0, stage1, 2, 1, 0, 1),
               message(k::recv, n::produced, 12 * ms, stage0, feeder, 0, 2, 0, 2),
               message(k::recv, n::released, 20 * ms, stage0, stage1, 2, 0, 0, 0),
               forward(start, start + 2 * ms, 2),
               message(k::send, n::produced, start + 3 * ms, stage0, stage1, 2, 0, 0, 2)};
  sort_trace_records(t.records);
  return t;
}

} // namespace

TEST_CASE("trace starvation: idle past the tolerance after its slot's release is credit starvation on that edge") {
  const auto found = find_starvation(held_forward(600 * ms), 200 * ms);
  CHECK(found.spans == 3);
  CHECK(found.stages == 1);
  REQUIRE(found.first);
  CHECK(found.first->at_ns == 20 * ms);
  const auto& what = found.first->what;
  CHECK(what.find("stage 0 held forward s0 mb2 runnable from 0.020000 s") != std::string::npos);
  CHECK(what.find("the release of slot 0 of edge 2 (activation 0) came from stage 1") != std::string::npos);
  CHECK(what.find("credit starvation on edge 2 (activation 0)") != std::string::npos);
  CHECK(what.find("idle 580.000 ms, over the 200.000 ms tolerance") != std::string::npos);
  CHECK(found.longest_ns == 580 * ms);
}

TEST_CASE("trace starvation: within the tolerance, or with a tolerance above the wait, nothing is found") {
  CHECK(!find_starvation(held_forward(21 * ms), 200 * ms).first);
  CHECK(!find_starvation(held_forward(600 * ms), 600 * ms).first);
}

TEST_CASE("trace starvation: a produced for later work does not excuse the wait; a release or its input does") {
  auto later = held_forward(600 * ms);
  later.records.push_back(message(trace_kind::recv, trace_name::produced, 590 * ms, stage0, feeder, 0, 0, 0, 3));
  sort_trace_records(later.records);
  const auto found = find_starvation(later, 200 * ms);
  REQUIRE(found.first);
  CHECK(found.first->at_ns == 20 * ms);

  // A release on any edge the stage writes may be what it waited for (the reducer's return of gradients).
  auto release = held_forward(600 * ms);
  release.records.push_back(message(trace_kind::recv, trace_name::released, 590 * ms, stage0, stage1, 4, 0, 0, 0));
  sort_trace_records(release.records);
  CHECK(!find_starvation(release, 200 * ms).first);

  // Its own input arriving late: the wait is for input, not idleness.
  auto input = held_forward(600 * ms);
  for (auto& r : input.records)
    if (r.kind == static_cast<std::uint8_t>(trace_kind::recv) && r.micro_batch == 2) r.t0_ns = 590 * ms;
  sort_trace_records(input.records);
  CHECK(!find_starvation(input, 200 * ms).first);
}

TEST_CASE("trace starvation: the previous span's end binds when the stage learned of it late") {
  // Forward mb1 ends at 9 ms but the stage sends its output only at 500 ms: it knew then.
  auto late = held_forward(600 * ms);
  for (auto& r : late.records)
    if (r.kind == static_cast<std::uint8_t>(trace_kind::send) && r.micro_batch == 1) r.t0_ns = 500 * ms;
  sort_trace_records(late.records);
  CHECK(!find_starvation(late, 200 * ms).first);
  const auto found = find_starvation(late, 50 * ms);
  REQUIRE(found.first);
  CHECK(found.first->at_ns == 500 * ms);
  CHECK(found.first->what.find("once its previous span had ended") != std::string::npos);
}
