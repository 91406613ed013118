// Starting a pipeline run in this process: plan, slot table, actor system,
// actors, and the trace. The one entry point for tools and tests.
#pragma once

#include "actors/compute.hpp"
#include "actors/plan.hpp"
#include "actors/protocol/errors.hpp"
#include "actors/trace/trace_recorder.hpp"

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace dsa::actors {

struct run_options {
  pipeline_options pipeline;
  std::chrono::milliseconds watchdog{60000}; // fail when no step completes for this long
  std::string run_dir;                       // writes run_dir/trace.dsat when not empty
  std::size_t scheduler_threads = 2;         // CAF worker threads (compute runs on its own threads)
};

// The model, optimizer and data of a run, borrowed: they must outlive run_pipeline.
// stages[s] and optimizers[s] belong to pipeline stage s.
struct run_parts {
  std::vector<stage_compute*> stages;
  std::vector<optimizer_compute*> optimizers;
  batch_source* source = nullptr;
};

struct run_result {
  bool ok = false;
  std::optional<failure_info> failure; // set when !ok: which actor, which step, why
  std::string error;                   // "<actor> failed in step <k>: <why>" when !ok
  std::vector<double> losses;          // per step: mean micro-batch loss
  trace_data trace;                    // the whole trace of the run
  std::string trace_path;              // "" when no run_dir
  std::string trace_error;             // "" when the trace file was written
};

// Runs options.pipeline.steps optimizer steps. Initialises each optimizer from its
// stage's parameters. Never hangs: a failure or the watchdog ends the run.
run_result run_pipeline(const run_options& options, const run_parts& parts);

} // namespace dsa::actors
