// Starting a pipeline run in this process: plan, slot table, actor system,
// actors, and the trace. The one entry point for tools and tests.
#pragma once

#include "actors/compute.hpp"
#include "actors/data_parallel.hpp"
#include "actors/plan.hpp"
#include "actors/protocol/failure_info.hpp"
#include "actors/step_hooks.hpp"
#include "actors/trace/trace_recorder.hpp"
#include "actors/trace/trace_writer.hpp"

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dsa::actors {

// How the optimizer shards get their starting state (see run_pipeline).
enum class optimizer_start {
  // run_pipeline calls optimizers[s]->init(stages[s]->parameters()): a fresh run.
  init_from_stages,
  // The caller restored each optimizer's whole state (master weights, moments,
  // counters) and each stage's working parameters (version first_step) before
  // run_pipeline, e.g. from a checkpoint; init is not called.
  already_loaded,
};

// The actors of a run (run_actors.hpp: only the code that talks to them sees CAF).
struct run_actors;

// Whether the run records a trace (spans and message edges) at all.
enum class trace_mode { record, off };

struct run_options {
  pipeline_options pipeline; // pipeline.steps: how many steps this run performs (from first_step)
  // Absolute number of the first step: the run performs steps first_step ..
  // first_step + pipeline.steps - 1. Messages, parameter versions, the trace
  // and every compute call use absolute numbers; the stages must hold
  // parameter version first_step (the result of step first_step - 1's update).
  std::uint32_t first_step = 0;
  optimizer_start optimizers = optimizer_start::init_from_stages;
  // Called once per completed step, in order (see step_hooks.hpp). When set,
  // like stop_after, no shard starts the update of step k + 1 before the hooks
  // of step k returned, so they may read the optimizers' state of step k.
  std::function<void(const step_summary&)> on_step;
  // Called after on_step with the completed step k; true ends the run after
  // step k: ok = true, steps_completed = k + 1 - first_step. A step is
  // complete when every optimizer shard applied its update and every stage
  // loaded the new version k + 1. When set, no shard starts the update of step
  // k + 1 before the coordinator decided to go on after k, so after a stop
  // every optimizer holds the state after step k and every stage parameter
  // version k + 1; forwards and backwards of step k + 1 that had started are
  // discarded (the stages' gradients are then partial sums: zero them or load
  // parameters before using them again). Checked on the coordinator: a signal
  // handler sets an atomic flag that this function reads.
  std::function<bool(std::uint32_t completed_step)> stop_after;
  // This process's figures for each step's summary (step_hooks::local_figures).
  std::function<std::vector<double>(std::uint32_t step)> local_figures;
  // Called once the actors are spawned, before the run starts.
  std::function<void(const run_actors&)> on_spawned;
  trace_mode trace = trace_mode::record; // off: no records, no trace file, an empty run_result::trace
  std::chrono::milliseconds watchdog{60000}; // fail when no step completes for this long
  std::string run_dir;                       // writes run_dir/trace.dsat when not empty (and tracing)
  trace_writer_options trace_stream;         // how often the trace streams to that file
  // With a trace file: run_result::trace holds only the records of the run's last
  // `result_trace_steps` steps (0: the whole trace). A long run's report then reads its
  // tail, not a trace that grows with the run's length (the file keeps everything).
  std::uint32_t result_trace_steps = 0;
  // More facts for the trace's info frame (key, value), after the runtime's own.
  std::vector<std::pair<std::string, std::string>> trace_facts;
  std::size_t scheduler_threads = 2;         // CAF worker threads (compute runs on its own threads)
  // This run as one replica of a data-parallel group (data_parallel.hpp). With
  // dp.size > 1 every rank calls run_pipeline with the same options but its rank
  // (and its own parts, whose source feeds that rank's share of each step): the
  // reducers sum each stage's gradients over the ranks, the coordinators sum the
  // step's loss and metrics and agree on stopping (step_summary and run_result
  // then hold the group's means), and the shards always wait for allow_atom. The
  // trace file of rank r > 0 is run_dir/trace.rank<r>.dsat. A failure on any rank
  // aborts the transport, so every rank's run fails instead of waiting.
  data_parallel_options dp;
  // Pipeline stages across processes: this process runs only the stages `placement`
  // puts here (run_parts holds null for the others, and tied names every stage's
  // tied index). Activations, their gradients, the tied gradient and the norm shares
  // cross to the other processes of the replica over `world` (pipe_link.hpp), with the
  // slot credits of one process. dp is then the group of processes running the same
  // stages (a net::subgroup_transport of `world`), and the coordinators of every
  // process agree on each step over `world`: the hooks see the loss, metrics and
  // gradient norm of the whole pipeline, averaged over the replicas. The trace file of
  // world rank w > 0 is run_dir/trace.rank<w>.dsat. A failure anywhere aborts `world`.
  stage_placement placement;
  net::transport* world = nullptr; // the job's transport; required when placement.split()
};

// The model, optimizer and data of a run, borrowed: they must outlive run_pipeline.
// stages[s] and optimizers[s] belong to pipeline stage s (null where another process
// runs stage s: run_options::placement).
struct run_parts {
  std::vector<stage_compute*> stages;
  std::vector<optimizer_compute*> optimizers;
  batch_source* source = nullptr;
  // Empty, or [s]: the position in stages[s]->parameters() of a parameter tied
  // between the first and the last stage (BERT's word embedding and MLM
  // decoder), -1 where the stage does not hold it. When both ends hold it,
  // their reducers sum its gradients before the update; the first stage's copy
  // counts in the gradient norm.
  std::vector<int> tied;
};

struct run_result {
  bool ok = false;
  std::optional<failure_info> failure; // set when !ok: which actor, which step, why
  std::string error;                   // "<actor> failed in step <k>: <why>" when !ok
  std::uint32_t steps_completed = 0;   // steps done (also on a failure); the next is first_step + steps_completed
  std::vector<double> losses;          // [i]: mean micro-batch loss of step first_step + i, completed steps only
                                       // (empty unless pipeline_options::keep_losses)
  double last_loss = 0;                // the last completed step's
  // The data source's position after the last completed step (batch_source::position; each
  // step's reaches the step hooks as step_summary::data_position).
  std::vector<std::uint64_t> last_data_position;
  trace_data trace;                    // the trace of the run (empty with trace_mode::off; read back
                                       // from the file when there is one; its last
                                       // run_options::result_trace_steps steps when set)
  std::string trace_path;              // "" when no run_dir
  std::string trace_error;             // "" when the trace file was written
};

// Runs options.pipeline.steps optimizer steps from options.first_step, or fewer
// when stop_after ends the run. With optimizer_start::init_from_stages it first
// initialises each optimizer from its stage's parameters. Never hangs: a
// failure or the watchdog ends the run. The compute objects are not touched
// after it returns.
run_result run_pipeline(const run_options& options, const run_parts& parts);

} // namespace dsa::actors
