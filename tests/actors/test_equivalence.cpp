// Equivalence: the synthetic model's parameters after N steps are the same with
// 1, 2 and 4 pipeline stages and in a plain loop without the runtime.
#include "parameter_check.hpp"
#include "synthetic_run.hpp"
#include "tests/support/compare.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

using namespace dsa::actors;
using dsa::test::synthetic_model;
using dsa::test::synthetic_pipeline;

TEST_CASE("equivalence: 1, 2 and 4 stages give the plain loop's parameters after 5 steps of 4 micro-batches") {
  // Each layer's gradient is summed over micro-batches in micro-batch order in
  // every layout, and every layer runs the same loops on the same rows, so the
  // layouts agree to the table's layout_equivalence tolerance (in practice bit for bit).
  const synthetic_model model{4, 5, 3, 0.05};
  const std::uint32_t M = 4, steps = 5;
  const auto reference = dsa::test::reference_parameters(model, M, steps);
  const auto initial = synthetic_pipeline(model, {1, M, steps}).parameters();
  for (std::uint32_t S : {1u, 2u, 4u}) {
    CAPTURE(S);
    pipeline_options options;
    options.stages = S;
    options.micro_batches = M;
    options.steps = steps;
    synthetic_pipeline pipe(model, options);
    auto result = dsa::test::run_synthetic(pipe, options);
    CAPTURE(result.error);
    REQUIRE(result.ok);
    dsa::test::check_parameters_close(pipe.parameters(), reference);
  }
  // The training moved the parameters (the test would be vacuous otherwise).
  const float* a = initial[0].data<float>();
  const float* b = reference[0].data<float>();
  double moved = 0;
  for (std::int64_t k = 0; k < initial[0].numel(); ++k) moved = std::max(moved, std::abs(double(a[k]) - b[k]));
  CHECK(moved > 1e-3);
}
