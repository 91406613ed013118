// The gradient reducer: its state machine without CAF (orders of events,
// out-of-order arrivals, protocol errors), and through the real runtime the
// reductions it exists for, against the plain loop: a parameter tied between the
// first and the last stage, and clipping by the global norm over all stages.
#include "actors/reducer_state.hpp"
#include "actors/trace/trace_analysis.hpp"
#include "parameter_check.hpp"
#include "synthetic_run.hpp"
#include "tests/support/compare.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

using namespace dsa::actors;
using dsa::test::synthetic_model;
using dsa::test::synthetic_pipeline;
using kind = reducer_action::kind;

namespace {

// The actions of an event that must be legal.
reducer_state::actions ok(const reducer_state::result& r) {
  REQUIRE_MESSAGE(r.has_value(), (r.has_value() ? "" : r.err().message));
  return *r;
}

bool has(const reducer_state::actions& a, kind k) {
  return std::any_of(a.begin(), a.end(), [&](const reducer_action& x) { return x.what == k; });
}

const reducer_action& find(const reducer_state::actions& a, kind k) {
  auto it = std::find_if(a.begin(), a.end(), [&](const reducer_action& x) { return x.what == k; });
  REQUIRE(it != a.end());
  return *it;
}

double max_abs_diff(const dsa::tensor& a, const dsa::tensor& b) {
  double d = 0;
  for (std::int64_t k = 0; k < a.numel(); ++k) d = std::max(d, std::abs(double(a.data<float>()[k]) - b.data<float>()[k]));
  return d;
}

} // namespace

TEST_CASE("reducer state: own totals forward right after the gather; the next step waits for the buffers") {
  reducer_state r(0, 2, tied_role::none, grad_scope::per_stage);
  auto a = ok(r.on_grads(3));
  REQUIRE(a.size() == 1);
  CHECK(a[0].what == kind::gather);
  CHECK(a[0].step == 3);
  a = ok(r.on_gathered(3, 2.5));
  REQUIRE(a.size() == 1); // nothing published: per-stage totals
  CHECK(a[0].what == kind::forward);
  CHECK(a[0].total == 2.5);
  CHECK(a[0].own == 2.5);
  // Step 4's gradients before the shard gave the buffers back: no gather yet.
  CHECK(ok(r.on_grads(4)).empty());
  a = ok(r.on_reduced_released());
  REQUIRE(a.size() == 1);
  CHECK(a[0].what == kind::gather);
  CHECK(a[0].step == 4);
}

TEST_CASE("reducer state: global totals wait for every stage's share and add them in stage order") {
  reducer_state r(1, 3, tied_role::none, grad_scope::global);
  // Stage 2's share of step 0 and even of step 1 arrive before this stage's gradients.
  CHECK(ok(r.on_partial(2, 0, 1e-17)).empty());
  CHECK(ok(r.on_partial(2, 1, 7.0)).empty());
  CHECK(find(ok(r.on_grads(0)), kind::gather).step == 0);
  auto a = ok(r.on_gathered(0, 1.0));
  REQUIRE(a.size() == 1);
  CHECK(a[0].what == kind::publish);
  CHECK(a[0].own == 1.0);
  a = ok(r.on_partial(0, 0, 1e17));
  const auto& f = find(a, kind::forward);
  CHECK(f.step == 0);
  CHECK(f.total == (1e17 + 1.0) + 1e-17); // stage order, not arrival order
  CHECK(f.own == 1.0);
  // Step 1: stage 2's early share was kept.
  CHECK(ok(r.on_reduced_released()).empty());
  CHECK(find(ok(r.on_grads(1)), kind::gather).step == 1);
  CHECK(has(ok(r.on_gathered(1, 2.0)), kind::publish));
  CHECK(find(ok(r.on_partial(0, 1, 3.0)), kind::forward).total == 12.0);
}

TEST_CASE("reducer state: the tied owner sums the copy's gradient, counts it, and waits until the copy read the sum") {
  reducer_state owner(0, 2, tied_role::owner, grad_scope::global);
  CHECK(ok(owner.on_tied_arrived(5)).empty()); // the last stage finishes its backward first
  CHECK(find(ok(owner.on_grads(5)), kind::gather).step == 5);
  auto a = ok(owner.on_gathered(5, 1.0));
  REQUIRE(a.size() == 1);
  CHECK(a[0].what == kind::tied_sum);
  a = ok(owner.on_tied_done(5, 0.5));
  CHECK(find(a, kind::publish).own == 1.5); // its share includes the summed tied gradient
  CHECK(has(a, kind::send_tied_down));
  CHECK(!has(a, kind::forward));
  CHECK(ok(owner.on_partial(1, 5, 2.0)).empty()); // the copy still reads the sum
  a = ok(owner.on_tied_down_released());
  CHECK(find(a, kind::forward).total == 3.5);
}

TEST_CASE("reducer state: the tied copy offers its gradient, excludes it from its share, and forwards after copying the sum") {
  reducer_state copy(1, 2, tied_role::copy, grad_scope::global);
  CHECK(find(ok(copy.on_grads(0)), kind::gather).step == 0);
  auto a = ok(copy.on_gathered(0, 2.0));
  CHECK(has(a, kind::send_tied_up));
  CHECK(find(a, kind::publish).own == 2.0);
  CHECK(ok(copy.on_partial(0, 0, 1.5)).empty()); // totals known, but the sum has not come back
  a = ok(copy.on_tied_arrived(0));
  REQUIRE(a.size() == 1);
  CHECK(a[0].what == kind::tied_copy);
  a = ok(copy.on_tied_done(0, 0.0));
  CHECK(find(a, kind::forward).total == 3.5);
}

TEST_CASE("reducer state: speculation tells the shard once its buffers are final, before the other shares") {
  reducer_state r(1, 3, tied_role::none, grad_scope::global, true);
  CHECK(find(ok(r.on_grads(0)), kind::gather).step == 0);
  auto a = ok(r.on_gathered(0, 1.0));
  REQUIRE(a.size() == 2);
  CHECK(a[0].what == kind::publish);
  CHECK(a[1].what == kind::early);
  CHECK(a[1].step == 0);
  CHECK(a[1].own == 1.0);
  CHECK(ok(r.on_partial(0, 0, 2.0)).empty()); // early goes once per step
  a = ok(r.on_partial(2, 0, 3.0));
  REQUIRE(a.size() == 1);
  CHECK(a[0].what == kind::forward);
  CHECK(a[0].total == 6.0);
  // Step 1 with every share in before the gather: early still precedes forward (every
  // rank's shard speculates on the same steps).
  CHECK(ok(r.on_reduced_released()).empty());
  CHECK(ok(r.on_partial(0, 1, 1.0)).empty());
  CHECK(ok(r.on_partial(2, 1, 1.0)).empty());
  CHECK(find(ok(r.on_grads(1)), kind::gather).step == 1);
  a = ok(r.on_gathered(1, 1.0));
  REQUIRE(a.size() == 3);
  CHECK(a[1].what == kind::early);
  CHECK(a[2].what == kind::forward);
}

TEST_CASE("reducer state: the speculating tied owner tells its shard only after the copy read the sum") {
  reducer_state owner(0, 2, tied_role::owner, grad_scope::global, true);
  CHECK(ok(owner.on_tied_arrived(0)).empty());
  CHECK(find(ok(owner.on_grads(0)), kind::gather).step == 0);
  CHECK(has(ok(owner.on_gathered(0, 1.0)), kind::tied_sum));
  CHECK(!has(ok(owner.on_tied_done(0, 0.5)), kind::early)); // the shard would change what the copy reads
  auto a = ok(owner.on_tied_down_released());
  REQUIRE(a.size() == 1);
  CHECK(a[0].what == kind::early);
  CHECK(a[0].own == 1.5);
  CHECK(find(ok(owner.on_partial(1, 0, 2.0)), kind::forward).total == 3.5);
}

TEST_CASE("reducer state: no speculation with own totals or one stage") {
  reducer_state per_stage(0, 2, tied_role::none, grad_scope::per_stage, true);
  ok(per_stage.on_grads(0));
  CHECK(!has(ok(per_stage.on_gathered(0, 1.0)), kind::early));
  reducer_state alone(0, 1, tied_role::none, grad_scope::global, true);
  ok(alone.on_grads(0));
  auto a = ok(alone.on_gathered(0, 1.0));
  CHECK(!has(a, kind::early));
  CHECK(has(a, kind::forward));
}

TEST_CASE("reducer state: protocol violations are errors") {
  reducer_state r(0, 2, tied_role::none, grad_scope::global);
  CHECK_FALSE(r.on_gathered(0, 1.0).has_value()); // no gather asked
  (void)ok(r.on_grads(0));
  CHECK_FALSE(r.on_grads(0).has_value());
  (void)ok(r.on_partial(1, 0, 1.0));
  CHECK_FALSE(r.on_partial(1, 0, 1.0).has_value()); // twice
  CHECK_FALSE(r.on_partial(0, 0, 1.0).has_value()); // its own stage
  CHECK_FALSE(r.on_tied_arrived(0).has_value());    // no tied role
}

TEST_CASE("reducer: a parameter tied between first and last stage matches the plain loop with summed gradients") {
  // The first and the last layer start equal and take the sum of their
  // gradients (first stage's term first, as the loop adds them), so they stay equal.
  synthetic_model model;
  model.layers = 4;
  model.tie_ends = true;
  const std::uint32_t M = 4, steps = 5;
  const auto reference = dsa::test::run_reference(model, M, steps);
  REQUIRE(max_abs_diff(reference.parameters.front(), reference.parameters.back()) == 0.0);
  for (grad_scope scope : {grad_scope::global, grad_scope::per_stage})
    for (std::uint32_t S : {2u, 4u}) {
      CAPTURE(S);
      CAPTURE(static_cast<int>(scope));
      pipeline_options options{S, M, steps};
      options.totals = scope;
      synthetic_pipeline pipe(model, options);
      auto result = dsa::test::run_synthetic(pipe, options);
      CAPTURE(result.error);
      REQUIRE(result.ok);
      auto params = pipe.parameters();
      dsa::test::check_parameters_close(params, reference.parameters);
      CHECK(max_abs_diff(params.front(), params.back()) == 0.0); // the two copies are identical
    }
  // Without the exchange the two ends drift apart: the test can fail.
  synthetic_model untied = model;
  untied.tie_ends = false;
  const auto apart = dsa::test::run_reference(untied, M, steps);
  CHECK(max_abs_diff(apart.parameters.front(), reference.parameters.front()) > 1e-4);
}

TEST_CASE("reducer: a streaming shard gets its stage's gradients part by part, last first, and matches the plain loop") {
  synthetic_model model;
  model.layers = 4;
  const std::uint32_t M = 3, steps = 4;
  const auto reference = dsa::test::run_reference(model, M, steps);
  for (std::uint32_t S : {1u, 2u}) {
    CAPTURE(S);
    pipeline_options options{S, M, steps};
    options.totals = grad_scope::per_stage;
    synthetic_pipeline pipe(model, options);
    for (auto& o : pipe.optimizers) o->set_streaming(true);
    auto result = dsa::test::run_synthetic(pipe, options);
    CAPTURE(result.error);
    REQUIRE(result.ok);
    dsa::test::check_parameters_close(pipe.parameters(), reference.parameters);
    for (std::uint32_t s = 0; s < S; ++s) {
      CAPTURE(s);
      const auto& o = *pipe.optimizers[s];
      CHECK(o.streamed() == steps);
      // One part per parameter (buckets of one element at most: each layer alone), in the
      // order backward finishes them, down to the first, for every step in turn.
      const auto layers = static_cast<std::uint32_t>(model.layers / S);
      std::vector<std::pair<std::uint32_t, std::uint32_t>> expected;
      for (std::uint32_t k = 0; k < steps; ++k)
        for (std::uint32_t p = layers; p-- > 0;) expected.emplace_back(k, p);
      CHECK(o.parts_seen() == expected);
    }
  }
  // A shard that cannot stream (SGD with clipping needs the global norm) gets no parts:
  // its update waits for the step's totals.
  synthetic_model clipped = model;
  clipped.clip = 0.05;
  pipeline_options options{1, M, steps};
  synthetic_pipeline pipe(clipped, options);
  pipe.optimizers[0]->set_streaming(true);
  auto result = dsa::test::run_synthetic(pipe, options);
  REQUIRE(result.ok);
  CHECK(pipe.optimizers[0]->streamed() == 0);
  CHECK(pipe.optimizers[0]->parts_seen().empty());
  dsa::test::check_parameters_close(pipe.parameters(), dsa::test::reference_parameters(clipped, M, steps));
}

TEST_CASE("reducer: clipping by the global norm over all stages (tied counted once) matches the plain loop") {
  synthetic_model model;
  model.layers = 4;
  model.tie_ends = true;
  model.clip = 0.05; // well below the gradient norm: every step clips
  const std::uint32_t M = 2, steps = 4;
  const auto reference = dsa::test::run_reference(model, M, steps);
  // With speculative_update the reducers send reduced_early first; the synthetic shard
  // does not speculate (the default optimizer_compute::speculate), so nothing changes.
  for (const bool speculate : {false, true})
  for (std::uint32_t S : {2u, 4u}) {
    CAPTURE(S);
    CAPTURE(speculate);
    pipeline_options options{S, M, steps};
    options.speculative_update = speculate;
    synthetic_pipeline pipe(model, options);
    auto result = dsa::test::run_synthetic(pipe, options);
    CAPTURE(result.error);
    REQUIRE(result.ok);
    dsa::test::check_parameters_close(pipe.parameters(), reference.parameters);
    CHECK(stage_spans(result.trace, "speculate", 0).empty());
    // Shard s's update of step k starts after every other reducer sent its share of
    // step k to reducer s (a causal order, not a timing).
    const std::uint32_t first_reducer = 3 + 2 * S; // pipeline_plan::reducer_id(0)
    for (std::uint32_t s = 0; s < S; ++s)
      for (const auto& update : stage_spans(result.trace, "optimizer", static_cast<std::int32_t>(s))) {
        std::uint32_t shares = 0;
        for (const auto& r : result.trace.records)
          if (r.kind == static_cast<std::uint8_t>(trace_kind::send) &&
              r.name == static_cast<std::uint16_t>(trace_name::grad_partial) && r.step == update.step &&
              r.peer == first_reducer + s) {
            ++shares;
            CHECK(r.t0_ns <= update.t0_ns);
          }
        CHECK(shares == S - 1);
      }
  }
  // A per-stage norm would clip differently: the global one matters here.
  synthetic_model unclipped = model;
  unclipped.clip = 0.0;
  CHECK(max_abs_diff(dsa::test::run_reference(unclipped, M, steps).parameters[1], reference.parameters[1]) > 1e-4);
}
