// Real CAF pipeline runs over the synthetic compute: 1F1B invariants asserted
// from the trace (orders and bounds, never timings).
#include "actors/trace/trace_analysis.hpp"
#include "synthetic_run.hpp"

#include <doctest/doctest.h>

#include <map>

using namespace dsa::actors;
using dsa::test::run_synthetic;
using dsa::test::synthetic_pipeline;

namespace {

// Forwards and backwards of stage s each in (step, micro-batch) order; at most
// S - s micro-batches between forward and backward; every micro-batch of every
// step both ways.
void check_stage_order(const trace_data& trace, std::uint32_t S, std::uint32_t s, std::uint32_t M,
                       std::uint32_t steps) {
  CAPTURE(S);
  CAPTURE(s);
  CAPTURE(M);
  auto ops = stage_compute_spans(trace, static_cast<std::int32_t>(s));
  REQUIRE(ops.size() == 2 * M * steps);
  int in_flight = 0, peak = 0;
  std::uint32_t fwd = 0, bwd = 0; // counts, also the expected next (step * M + mb)
  for (const auto& op : ops) {
    const bool forward = trace.names[op.name] == "forward";
    const std::uint32_t index = op.step * M + op.micro_batch;
    if (forward) {
      CHECK(index == fwd++);
      ++in_flight;
    } else {
      CHECK(index == bwd++);
      --in_flight;
    }
    CHECK(in_flight >= 0);
    peak = std::max(peak, in_flight);
  }
  CHECK(peak <= static_cast<int>(S - s));
  CHECK(in_flight == 0);
}

// No forward of step k + 1 on a stage before its step-k update was applied and loaded.
void check_versions(const trace_data& trace, std::uint32_t s, std::uint32_t steps) {
  auto updates = stage_spans(trace, "optimizer", static_cast<std::int32_t>(s));
  auto loads = stage_spans(trace, "load", static_cast<std::int32_t>(s));
  REQUIRE(updates.size() == steps);
  REQUIRE(loads.size() == steps);
  for (const auto& f : stage_spans(trace, "forward", static_cast<std::int32_t>(s))) {
    if (f.step == 0) continue;
    const auto& update = updates[f.step - 1];
    const auto& load = loads[f.step - 1];
    CHECK(update.step == f.step - 1);
    CHECK(load.step == f.step);
    CHECK(update.t1_ns <= f.t0_ns);
    CHECK(load.t1_ns <= f.t0_ns);
  }
}

// A run of S stages and `layers` layers over `steps` steps of M micro-batches: the
// orders and bounds above on every stage, idle fractions that follow from the
// trace's own spans, and SGD progress.
void check_1f1b_run(std::uint32_t S, std::uint32_t M, std::uint32_t layers, std::uint32_t steps) {
  pipeline_options options;
  options.stages = S;
  options.micro_batches = M;
  options.steps = steps;
  synthetic_pipeline pipe({layers, 5, 3, 0.05}, options);
  auto result = run_synthetic(pipe, options);
  CAPTURE(result.error);
  REQUIRE(result.ok);
  for (std::uint32_t s = 0; s < S; ++s) {
    check_stage_order(result.trace, S, s, M, steps);
    check_versions(result.trace, s, steps);
  }
  const auto expected_idle = dsa::test::one_f_one_b_idle(result.trace, S);
  for (const auto& idle : stage_idle_fractions(result.trace, S, M)) {
    CHECK(idle.idle_fraction == doctest::Approx(expected_idle.at(idle.stage)).epsilon(1e-9));
    CHECK(idle.bubble == doctest::Approx(double(S - 1) / double(M + S - 1)));
    MESSAGE("S=" << S << " M=" << M << " stage " << idle.stage << " idle " << idle.idle_fraction
                 << " bubble " << idle.bubble);
  }
  REQUIRE(result.losses.size() == steps);
  CHECK(result.losses.back() < result.losses.front()); // SGD makes progress
  CHECK(result.last_loss == result.losses.back());
  // Without keep_losses (dsactor run's long runs) only the last loss is kept: the same one.
  options.keep_losses = false;
  synthetic_pipeline again({layers, 5, 3, 0.05}, options);
  auto lean = run_synthetic(again, options);
  REQUIRE(lean.ok);
  CHECK(lean.losses.empty());
  CHECK(lean.steps_completed == steps);
  CHECK(lean.last_loss == result.last_loss);
}

} // namespace

TEST_CASE("pipeline run: 1F1B invariants from the trace, S in {2, 4}, M in {1, 4, 8}") {
  for (std::uint32_t S : {2u, 4u})
    for (std::uint32_t M : {1u, 4u, 8u}) check_1f1b_run(S, M, 4, 3);
}

TEST_CASE("pipeline run: deep pipelines, S in {5, 8} and M = 2S, keep the 1F1B invariants") {
  // The exact order depends on message timing here; the scheduler tests check it
  // against DeepSpeed's with the same scheduler and feeder rule in simulation.
  for (std::uint32_t S : {5u, 8u}) check_1f1b_run(S, 2 * S, S, 2);
}

TEST_CASE("pipeline run: message edges pair up in the trace") {
  pipeline_options options;
  options.stages = 2;
  options.micro_batches = 4;
  options.steps = 2;
  synthetic_pipeline pipe({4, 5, 3, 0.05}, options);
  auto result = run_synthetic(pipe, options);
  REQUIRE(result.ok);
  std::map<std::uint64_t, int> flows;
  std::uint64_t produced_bytes = 0;
  for (const auto& r : result.trace.records) {
    if (r.kind == static_cast<std::uint8_t>(trace_kind::send)) ++flows[r.flow];
    if (r.kind == static_cast<std::uint8_t>(trace_kind::recv)) --flows[r.flow];
    if (r.kind == static_cast<std::uint8_t>(trace_kind::send) && result.trace.names[r.name] == "produced")
      produced_bytes += r.bytes;
  }
  CHECK(!flows.empty());
  for (const auto& [flow, balance] : flows) CHECK(balance == 0);
  CHECK(produced_bytes > 0);
}

TEST_CASE("pipeline run: GPipe policy keeps every forward before the first backward") {
  pipeline_options options;
  options.stages = 2;
  options.micro_batches = 4;
  options.steps = 2;
  options.schedule = schedule_kind::gpipe;
  synthetic_pipeline pipe({4, 5, 3, 0.05}, options);
  auto result = run_synthetic(pipe, options);
  REQUIRE(result.ok);
  for (std::uint32_t s = 0; s < 2; ++s) {
    auto ops = stage_compute_spans(result.trace, static_cast<std::int32_t>(s));
    REQUIRE(ops.size() == 16);
    for (std::size_t i = 0; i < ops.size(); ++i)
      CHECK(result.trace.names[ops[i].name] == ((i % 8) < 4 ? "forward" : "backward"));
  }
}
