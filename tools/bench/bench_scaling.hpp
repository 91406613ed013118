// Weak scaling of data parallelism for `dsactor bench allreduce`: BERT-mini's training
// step with one process against `dsactor launch --num_procs 2` at the same per-rank batch
// (each rank micro-batch x accumulation sequences a step), both runs of this very binary
// on the quick start's data. Efficiency = dp=1 step time / dp=2 step time (1 is perfect:
// twice the samples in the same time).
#pragma once

#include "core/error.hpp"

#include <string>

namespace dsa::tools {

struct scaling_plan {
  std::string work_dir;    // a fresh folder for the configs, run directories and logs
  int steps = 6, warmup = 2; // steps per run; the first `warmup` are not timed
  int micro_batch = 8, accumulation = 2, seq = 128;
};

struct scaling_result {
  double dp1_step_s = 0, dp2_step_s = 0; // medians of the timed steps (rank 0's metrics)
  double efficiency() const { return dp2_step_s > 0 ? dp1_step_s / dp2_step_s : 0; }
};

// Runs both trainings (prepares the quick start's data on first use, as `./ds run
// configs/quickstart.toml` does); an error names the run that failed and its log.
expected<scaling_result> bench_weak_scaling(const scaling_plan& plan);

} // namespace dsa::tools
