// Test helper: a pipeline of linear_stack stages with SGD and a synthetic
// source, run through the real CAF runtime.
#pragma once

#include "actors/run.hpp"
#include "actors/trace/analysis/trace_summary.hpp"
#include "actors/synthetic/linear_stack.hpp"
#include "actors/synthetic/sgd.hpp"
#include "actors/synthetic/synthetic_source.hpp"

#include <memory>
#include <vector>

namespace dsa::test {

struct synthetic_model {
  std::uint32_t layers = 4;
  std::int64_t width = 5; // awkward on purpose
  std::int64_t rows = 3;
  double lr = 0.05;
  // Optional: the last layer tied to the first (same start, gradients summed), and
  // SGD clipping the global gradient norm at `clip` (0: off).
  bool tie_ends = false;
  double clip = 0.0;
  // Data parallelism: this pipeline is rank dp_rank of dp_size replicas (its source
  // feeds global micro-batches dp_rank * M .. dp_rank * M + M - 1; SGD averages
  // over dp_size * M micro-batches).
  int dp_rank = 0;
  int dp_size = 1;
};

struct synthetic_pipeline {
  synthetic_pipeline(const synthetic_model& model, const actors::pipeline_options& options);

  actors::run_parts parts();
  // Working parameters of every layer, first stage first.
  std::vector<tensor> parameters();
  // Installs `all` (every layer, first stage first) as the stages' working
  // parameters and zeros their gradients (the state a checkpoint load leaves).
  void load(const std::vector<tensor>& all);
  // The optimizers' fp32 master copies, first stage first.
  std::vector<tensor> master();

  std::vector<std::unique_ptr<actors::stage_compute>> stages;
  std::vector<std::unique_ptr<actors::sgd>> optimizers;
  std::unique_ptr<actors::synthetic_source> source;
  std::vector<int> tied; // run_parts::tied
};

// Per stage, 1 - busy / window, where step k's window runs from stage 0's first
// forward to its last backward of k (the first and the last compute of a 1F1B or
// GPipe step by dataflow) and busy sums the stage's forward and backward spans.
std::vector<double> one_f_one_b_idle(const actors::trace_data& trace, std::uint32_t stages);

actors::run_result run_synthetic(synthetic_pipeline& pipeline, const actors::pipeline_options& options,
                                 const std::string& run_dir = "");

// The traces of a real 2-stage synthetic run (M = 4, 3 steps) in a temporary run
// directory called `name` (removed after), read back with load_run_traces.
expected<std::vector<actors::rank_trace>> two_stage_run_traces(const std::string& name);

// The plain-loop reference: the same model and math, no runtime, steps 0 .. steps - 1.
struct reference_run {
  std::vector<tensor> parameters; // after the last step
  std::vector<double> losses;     // per step: mean micro-batch loss
};
reference_run run_reference(const synthetic_model& model, std::uint32_t micro_batches, std::uint32_t steps);
std::vector<tensor> reference_parameters(const synthetic_model& model, std::uint32_t micro_batches,
                                         std::uint32_t steps);

} // namespace dsa::test
