// The phases of one `dsactor run`, in the order run_training (trainer.cpp) calls them, and
// what each hands the next. A phase returns 0 to go on, or the exit code the run ends with
// after printing why (1: a failure; 2: a bad configuration; 130: stopped by a signal).
#pragma once

#include "actors/run.hpp"
#include "actors/train/run/job_membership.hpp"
#include "actors/train/memory/device_plan.hpp"
#include "actors/train/memory/memory_plan.hpp"
#include "actors/train/run/metrics.hpp"
#include "actors/train/run/progress.hpp"
#include "actors/train/run/run_context.hpp"
#include "actors/train/run/run_setup.hpp"
#include "actors/train/run/step_reporter.hpp"
#include "actors/train/run/trainer.hpp"
#include "io/net/comms_logger.hpp"
#include "io/net/local_transport.hpp"
#include "io/net/subgroup_transport.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace dsa::train {

// Prints "dsactor run: <message>" and returns `code`; without a code, 2 for a configuration
// error and 1 for anything else.
int fail_run(const error& e, int code);
int fail_run(const error& e);

// Closes the run's log file (core/log.hpp) when the run ends.
struct log_file_guard {
  bool open = false;
  log_file_guard() = default;
  log_file_guard(const log_file_guard&) = delete;
  log_file_guard& operator=(const log_file_guard&) = delete;
  ~log_file_guard();
};

// 1. Open the run: the config with its --set flags, the job this process joins under
// dsactor launch, the run directory with its log and effective config.
struct opened_run {
  run_context ctx;                   // this process's first rank: rc, cfg, rank, trace_facts
  std::optional<job_membership> job; // under dsactor launch
  bool lead = true;                  // the job's rank 0: reports, saves and evaluates
  std::int64_t rss_before_data = 0; // resident bytes before the data opened (the memory plan's base)
  // Stages across processes, rank 0: the other stages' weights for the evaluation, by name.
  std::map<std::string, tensor> weights_elsewhere;
  bool weights_moved = false; // move_evaluation_weights ran
  // A CUDA rank: the device pool's high-water mark over the training (read before the
  // final evaluation's GPU model comes from the same pool); -1 until then.
  std::int64_t device_peak = -1;
  log_file_guard log;                // last: the log closes before the rest goes
};
int open_run(const run_request& req, opened_run& run);
// The pipe-data layout of a job with stages across processes, for the log: which ranks
// run which stages, and this process's place.
std::string describe_pipe_layout(const run_inputs& in, int processes);
// "rank 3 ran stage 1 of replica 1": where rank `rank` of such a job sits.
std::string describe_rank_stages(const run_config& rc, int processes, int rank);

// 2. The data: the vocabulary and tokenizer, the batch provider, the run's last step.
int open_data(opened_run& run);

// 3. The plan: limits.host_memory, refused before the stages and shards allocate anything,
// and what every process of a job must do alike.
struct run_plan {
  std::optional<host_memory_plan> memory;
  device_memory_plan device; // a CUDA rank's (empty on the CPU)
  bool evaluates = true; // the final evaluation fits the budget
};
int plan_run(opened_run& run, run_plan& plan);
// Stages across processes, when the final evaluation runs: each other stage's owner (data
// rank 0 of its processes) sends its weights to rank 0 (weights_elsewhere), in stage order,
// and every process meets at a barrier after (a sender must not exit before rank 0 has
// them). Once per run; 0 or the exit code.
int move_evaluation_weights(opened_run& run, const run_plan& plan);

// 4. The ranks of this process: each with its stages, deciders and restored state.
struct process_ranks {
  std::vector<rank_start> starts;                     // one per rank
  std::vector<std::unique_ptr<run_context>> replicas; // ranks 1..R-1 (rank 0's is opened_run::ctx)
  run_context& context(opened_run& run, int r) { return r == 0 ? run.ctx : *replicas[static_cast<std::size_t>(r - 1)]; }
};
int build_ranks(opened_run& run, process_ranks& ranks);

// 5. Train: each rank's shards and runtime parts, the reporter on rank 0, then the steps.
struct training {
  // The end-of-run report reads the trace of the last this many steps (0: all of it, for
  // --trace-chrome): its memory does not grow with the run's length.
  std::uint32_t report_steps = 1000;
  int world = 1;       // data-parallel ranks of the job
  bool global = false; // the updates wait for every stage's gradient norm (clipping, fp16)
  bool zero = false;   // every rank writes files of its own into a checkpoint
  std::optional<metrics_writer> metrics;
  std::optional<progress> bar;
  std::unique_ptr<net::local_group> group; // the in-process ranks' transports
  // Stages across processes: the processes running this process's stages (the data-parallel
  // group), within the job's transport.
  std::unique_ptr<net::subgroup_transport> replicas;
  std::optional<net::comms_logger> comms;
  std::vector<rank_run> runs;
  std::optional<step_reporter> reporter; // the job's rank 0
  std::vector<actors::run_result> results;
  std::int64_t last_sent = -1; // stages across processes: the last step whose states went to rank 0
  // Rank r's transport to the other data-parallel ranks: UCX between processes (with stages
  // across processes, the subgroup running the same stages), or the in-process group.
  net::transport* transport(const opened_run& run, int r) const;
};
int start_training(opened_run& run, process_ranks& ranks, training& t);
// Stages across processes, the owner of stages rank 0 lacks (data-parallel rank 0 of its
// processes): each of its shards' checkpoint payloads to rank 0, in stage order. Throws.
void send_stage_payloads(opened_run& run, training& t, std::int64_t step);

// Work of this process's ranks on threads of their own (the one place a phase starts
// them): start(r, work) runs work() on a new thread; an exception becomes rank r's error
// and wakes its peers still waiting in a collective (its transport is aborted). join()
// waits for every thread and returns each rank's error ("" for none).
class rank_threads {
public:
  rank_threads(opened_run& run, training& t, int ranks) : run_(run), t_(t), errors_(static_cast<std::size_t>(ranks)) {}
  rank_threads(const rank_threads&) = delete;
  rank_threads& operator=(const rank_threads&) = delete;
  ~rank_threads() { join(); }
  void start(int r, std::function<void()> work);
  bool empty() const { return threads_.empty(); }
  const std::vector<std::string>& join();

private:
  opened_run& run_;
  training& t_;
  std::vector<std::string> errors_;
  std::vector<std::thread> threads_;
};
int run_steps(opened_run& run, process_ranks& ranks, training& t);

// 6. Finish: ZeRO-3's whole weights gathered back, the final checkpoint, the last swap
// writes landed, and the job left together.
struct finished {
  std::int64_t done = -1; // the last completed step
  bool stopped = false;   // by a signal, or the job ended early
};
int finish_training(opened_run& run, const run_plan& plan, process_ranks& ranks, training& t, finished& f);

// 7. Report: the trace, the bubble and overlap, communication, speculation and swap lines.
int report_training(const run_request& req, opened_run& run, training& t);

} // namespace dsa::train
