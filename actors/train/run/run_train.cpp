// The training phase of `dsactor run`: each rank's shards and runtime parts, the step
// reporter, then the steps on the actor runtime, one thread per in-process rank; see
// run_phases.hpp.
#include "actors/train/config/pipeline_config.hpp"
#include "actors/train/run/run_phases.hpp"

#include "actors/train/run/signals.hpp"
#include "actors/train/run/stage_states.hpp"
#include "core/log.hpp"
#include "core/test_fault.hpp"
#include "io/ckpt/checkpoint_dir.hpp"
#include "io/net/rendezvous.hpp"

#include <fmt/format.h>
#include <malloc.h>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <optional>
#include <cstdlib>
#include <stdexcept>
#include <thread>

namespace dsa::train {

namespace {

// How the updates wait for the gradients, and what data parallelism shares.
void log_training_layout(const run_config& rc, const training& t, bool launched) {
  log_info("optimizer updates: {}", t.global ? "after the reducers exchanged every stage's gradient norm "
                                               "(gradient clipping or loss scaling need it)"
                                             : "each stage's as soon as its gradients are reduced (no clipping, "
                                               "no loss scaling)");
  if (rc.speculative_host_stream() && rc.stages == 1)
    log_info("speculative update: the stage's update in host memory streams over the backward assuming the norm "
             "does not clip and nothing overflows, copying each parameter's state as it steps; a step that clips is "
             "taken back and redone after the backward, one that overflows taken back and skipped");
  else if (rc.speculative_update && !(t.global && rc.stages > 1))
    log_info("speculative update: nothing to speculate on ({})",
             t.global ? "one stage: the global norm is known with its gradients" : "no global norm to wait for");
  const char* zero_held =
      rc.zero_stage >= 3   ? "the working weights (each layer's gathered as it runs), the optimizer state and the reduced gradients"
      : rc.zero_stage >= 2 ? "the optimizer state and the reduced gradients"
                           : "the optimizer state";
  if (t.world > 1)
    log_info("data parallel: {} ranks{}; gradients summed over them in buckets of up to {} elements, "
             "{} ({})",
             t.world,
             launched ? (rc.stages_across_processes() ? " (one per group of processes running the same stages)"
                                                      : " (one per process)")
                      : " in this process",
             rc.reduce_bucket_elements,
             rc.overlap_comm ? "each started as backward finishes it (overlap_comm)" : "after the step's backward",
             rc.zero_stage >= 1 ? fmt::format("ZeRO stage {}: each rank holds {} of 1/{} of the parameters",
                                              rc.zero_stage, zero_held, t.world)
                                : std::string("ZeRO stage 0: every rank holds the whole optimizer state"));
  if (t.world > 1 && !rc.zero_note.empty()) log_info("{}", rc.zero_note);
  if (rc.stages_across_processes())
    log_info("pipeline stages across processes: activations and their gradients, the tied embedding's gradient "
             "and the norm shares go between the {} processes of each replica over the transport, with {} "
             "activation and {} gradient slots per edge as credits",
             rc.pipe_processes, actors::pipeline_options{}.activation_slots, actors::pipeline_options{}.gradient_slots);
}

// The runtime's options shared by every rank of the process.
actors::run_options shared_run_options(const run_inputs& in, bool global, bool resumed) {
  const run_config& rc = in.rc;
  actors::run_options ro;
  ro.pipeline.stages = rc.stages;
  ro.pipeline.micro_batches = static_cast<std::uint32_t>(rc.batch.gradient_accumulation);
  ro.pipeline.steps = in.last_step - in.first_step + 1;
  ro.pipeline.keep_losses = false; // the report needs the last loss only
  ro.pipeline.schedule = schedule_kind_of(rc);
  ro.pipeline.max_stashed = static_cast<std::uint32_t>(rc.max_stashed);
  ro.pipeline.max_deferred_w = static_cast<std::uint32_t>(rc.max_deferred_w);
  ro.pipeline.totals = global ? actors::grad_scope::global : actors::grad_scope::per_stage;
  ro.pipeline.speculative_update = rc.speculative_update;
  ro.first_step = in.first_step;
  if (resumed) ro.optimizers = actors::optimizer_start::already_loaded;
  // The shards wait for each on_step to return before their next update (step_hooks.hpp);
  // with several ranks the coordinators stop when any rank is asked to.
  const std::uint32_t last = in.last_step;
  ro.stop_after = [last](std::uint32_t k) { return stop_requested() && k != last; };
  ro.watchdog = std::chrono::seconds(rc.watchdog_seconds);
  ro.run_dir = rc.run_dir;
  ro.trace_facts = in.trace_facts;
  return ro;
}

// Test-only faults, each "MARKER:PROCESS:STEP" (several joined by commas) and each once: that process of a launched job,
// once step STEP's hooks ran and if MARKER does not exist yet (it is created first, so a
// restarted job runs on), DSA_TEST_KILL_ONCE: kills itself (SIGKILL); DSA_TEST_WAIT_ONCE:
// waits until the file MARKER.go exists (the test does something to the job meanwhile, a
// host's link cut, then writes it). Lets the restart tests fail a job at a chosen step
// without timing.
struct step_fault {
  std::string marker;
  int process = -1;
  std::uint32_t step = 0;
};

// The faults of `name` for `process`.
std::vector<step_fault> test_faults_of(const char* name, int process) {
  std::vector<step_fault> out;
  const char* spec = std::getenv(name);
  if (!spec || !*spec) return out;
  auto specs = test_fault::split_fault_specs(spec, 2);
  if (!specs) throw std::runtime_error(fmt::format("{}: expected MARKER:PROCESS:STEP, got {}", name, spec));
  for (const auto& f : *specs) {
    step_fault s{f[0], std::stoi(f[1]), static_cast<std::uint32_t>(std::stoul(f[2]))};
    if (s.process == process) out.push_back(std::move(s));
  }
  return out;
}


std::function<void(const actors::step_summary&)> with_test_fault(std::function<void(const actors::step_summary&)> hook,
                                                                 int process) {
  auto kills = test_faults_of("DSA_TEST_KILL_ONCE", process), waits = test_faults_of("DSA_TEST_WAIT_ONCE", process);
  if (kills.empty() && waits.empty()) return hook;
  return [hook = std::move(hook), kills, waits](const actors::step_summary& summary) {
    if (hook) hook(summary);
    for (const auto& wait : waits)
      if (summary.step == wait.step && test_fault::claim(wait.marker)) {
        log_warn("DSA_TEST_WAIT_ONCE: waiting after step {} for {}.go", wait.step, wait.marker);
        while (::access((wait.marker + ".go").c_str(), F_OK) != 0)
          std::this_thread::sleep_for(std::chrono::milliseconds(10)); // the test writes the file
      }
    for (const auto& kill : kills)
      if (summary.step == kill.step && test_fault::claim(kill.marker)) {
        log_warn("DSA_TEST_KILL_ONCE: killing this process after step {}", kill.step);
        ::raise(SIGKILL);
      }
  };
}

// Rank r's options: the job's rank 0 reports each step; with ZeRO the other ranks take
// part in each interval checkpoint's gathers.
actors::run_options rank_run_options(const actors::run_options& shared, opened_run& run, process_ranks& ranks,
                                     training& t, int r) {
  const run_config& rc = run.ctx.rc;
  actors::run_options o = shared;
  const int global_rank = run.ctx.rank + r; // the data-parallel rank
  if (run.lead && r == 0) o.on_step = [&t](const actors::step_summary& summary) { t.reporter->on_step(summary); };
  // wall_clock_breakdown: each process's stage timers, summed over a replica's processes.
  if (rc.wall_clock_breakdown && r == 0) {
    stage_shared* timers = &run.ctx.shared;
    o.local_figures = [timers](std::uint32_t step) { return take_stage_times(*timers, step); };
  }
  if (t.world > 1)
    o.dp = {global_rank, t.world, t.transport(run, r), rc.reduce_bucket_elements, rc.overlap_comm,
            r == 0 ? &*t.comms : nullptr, rc.shared_memory_allreduce};
  if (rc.stages_across_processes()) {
    o.world = run.job->transport.get();
    o.placement = run.ctx.placement;
    // The owners of the other stages send their state for each checkpoint rank 0 writes.
    if (!run.lead && run.ctx.rank == 0)
      o.on_step = [&run, &t](const actors::step_summary& summary) {
        if (checkpoint_due(run.ctx.rc, summary.step)) send_stage_payloads(run, t, summary.step);
      };
  }
  if (global_rank != 0 && t.zero) // ZeRO or 1-bit: its part of each checkpoint's collectives and files
    o.on_step = [&run, &ranks, &t, r](const actors::step_summary& summary) {
      if (checkpoint_due(run.ctx.rc, summary.step))
        contribute_checkpoint(t.runs[static_cast<std::size_t>(r)], run.ctx.rc.checkpoint.dir, summary.step);
    };
  if (r == 0 && run.job) {
    test_fault::set_process(run.ctx.process);
    o.on_step = with_test_fault(std::move(o.on_step), run.ctx.process);
  }
  return o;
}

} // namespace

void rank_threads::start(int r, std::function<void()> work) {
  threads_.emplace_back([this, r, work = std::move(work)] {
    try {
      work();
    } catch (const std::exception& e) {
      errors_[static_cast<std::size_t>(r)] = e.what();
      if (auto* x = t_.transport(run_, r)) x->abort(make_error(errc::runtime, "rank {}: {}", run_.ctx.rank + r, e.what()));
    }
  });
}

const std::vector<std::string>& rank_threads::join() {
  for (auto& thread : threads_)
    if (thread.joinable()) thread.join();
  threads_.clear();
  return errors_;
}

void send_stage_payloads(opened_run& run, training& t, std::int64_t step) {
  // Each shard's part, with the collectives of its data-parallel group in the order every
  // rank takes them (step_reporter::save, contribute_checkpoint): error buffers, masters,
  // partition files.
  const auto& shards = t.runs[0].shards;
  const auto& root = run.ctx.rc.checkpoint.dir;
  const auto next = static_cast<std::uint64_t>(step) + 1;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    if (!shards[s]) continue;
    stage_checkpoint_part part;
    if (shards[s]->saves_errors()) part.staged = shards[s]->stage_errors(root, next);
    if (shards[s]->per_rank_checkpoint()) {
      part.payload = shards[s]->gathered_masters();
      auto files = shards[s]->stage_partition(root, next);
      part.staged.insert(part.staged.end(), files.begin(), files.end());
    } else {
      // The stage's optimizer state goes into its own file, written here; rank 0 gets the
      // masters for the one HuggingFace-named model file.
      named_tensors state;
      for (auto& [name, tensor] : shards[s]->payload())
        (name.rfind("master.", 0) == 0 ? part.payload : state).emplace(name, tensor);
      if (!state.empty()) {
        auto file = ckpt::stage_group(root, next, fmt::format("optimizer_{}", s), state);
        if (!file)
          throw std::runtime_error(fmt::format("writing stage {}'s optimizer state: {}", s, file.err().message));
        part.staged.push_back(*file);
      }
    }
    if (auto sent = send_checkpoint_part(*run.job->transport, 0, part); !sent)
      throw std::runtime_error(fmt::format("sending stage {}'s checkpoint state to rank 0: {}", s, sent.err().message));
  }
  t.last_sent = step;
}

net::transport* training::transport(const opened_run& run, int r) const {
  if (replicas) return replicas.get();
  if (run.job) return run.job->transport.get();
  return group ? &group->at(r) : nullptr;
}

int start_training(opened_run& run, process_ranks& ranks, training& t) {
  run_context& ctx = run.ctx;
  const run_config& rc = ctx.rc;
  // Rows are numbered by completed steps: a resumed run keeps rows 1..first_step. Rank 0
  // alone writes them (and the progress, and checkpoints).
  if (run.lead) {
    auto m = ranks.starts[0].resumed ? metrics_writer::open_resumed(rc.run_dir, ctx.first_step)
                                     : metrics_writer::open(rc.run_dir);
    if (!m) return fail_run(m.err(), 1);
    t.metrics.emplace(std::move(*m));
  }
  t.bar.emplace(ctx.first_step, ctx.last_step + 1, run.lead ? rc.steps_per_print : 0, progress::detect_style());
  t.global = rc.gradient_clipping > 0 || rc.working == precision::f16;
  t.world = static_cast<int>(rc.batch.data_parallel_size);
  log_training_layout(rc, t, run.job.has_value());
  const int R = static_cast<int>(rc.ranks);
  if (run.job && rc.stages_across_processes()) {
    // The data-parallel group: the processes running this process's stages.
    const int p = run.ctx.process / t.world;
    std::vector<int> members;
    for (int d = 0; d < t.world; ++d) members.push_back(p * t.world + d);
    t.replicas = std::make_unique<net::subgroup_transport>(*run.job->transport, std::move(members));
  }
  // One rank with ZeRO-3 (offload_param on NVMe) still needs a transport for its
  // fetcher's and shard's communicators: a group of one.
  if (R > 1 || (!run.job && rc.zero_partitions())) t.group = std::make_unique<net::local_group>(R);
  // ZeRO stages 1 and 2: each rank's shards hold 1/world of the optimizer state.
  // Every rank writes files of its own into a checkpoint: with ZeRO its optimizer
  // partition, with a compressed optimizer its 1-bit error buffers.
  t.zero = (rc.zero_partitions() || rc.optimizer.compressed()) && t.world > 1;
  // comms_logger: this process's first rank's collectives (every rank issues the same ones).
  t.comms.emplace(rc.comms_logger, t.world);
  for (int r = 0; r < R; ++r) {
    run_context& rank = ranks.context(run, r);
    auto rr = make_rank_run(rank, rank, ranks.starts[static_cast<std::size_t>(r)], t.transport(run, r),
                            r == 0 && t.world > 1 ? &*t.comms : nullptr);
    if (!rr) return fail_run(rr.err(), 1);
    t.runs.push_back(std::move(*rr));
  }
  std::vector<const model_shard*> shard_views;
  for (const auto& shard : t.runs[0].shards) shard_views.push_back(shard.get());
  if (run.lead) t.reporter.emplace(ctx, ctx, *t.metrics, *t.bar, shard_views);
  if (run.lead && rc.stages_across_processes())
    t.reporter->set_remote_part([&run](std::uint32_t s) {
      auto got = recv_checkpoint_part(*run.job->transport, run.ctx.placement.process.at(s));
      if (!got)
        throw std::runtime_error(fmt::format("stage {}'s checkpoint state from rank {}: {}", s,
                                             run.ctx.placement.process.at(s), got.err().message));
      return std::move(*got);
    });
  return 0;
}

int run_steps(opened_run& run, process_ranks& ranks, training& t) {
  const int R = static_cast<int>(run.ctx.rc.ranks);
  // Under a budget, what the set-up freed goes back before the steps: a resume's restore
  // (many small buffers: the checkpoint's tensors, the swapped state's chunks) leaves holes
  // in the heap that stay resident, and the steps' allocations, of other sizes, did not fit
  // them (a resumed 29M ZeRO-3 run on NVMe measured 145.6 MiB under its 140 MiB budget).
  if (run.ctx.rc.host_memory > 0) malloc_trim(0);
  actors::run_options shared = shared_run_options(run.ctx, t.global, ranks.starts[0].resumed.has_value());
  shared.result_trace_steps = t.report_steps;
  t.results.resize(static_cast<std::size_t>(R));
  rank_threads others(run, t, R);
  for (int r = 1; r < R; ++r)
    others.start(r, [&, r] {
      t.results[static_cast<std::size_t>(r)] =
          actors::run_pipeline(rank_run_options(shared, run, ranks, t, r), t.runs[static_cast<std::size_t>(r)].parts);
    });
  try {
    t.results[0] = actors::run_pipeline(rank_run_options(shared, run, ranks, t, 0), t.runs[0].parts);
  } catch (const std::exception& e) {
    // As rank_threads does for the others: the rank's failure, and its peers woken.
    t.results[0].ok = false;
    t.results[0].error = fmt::format("rank {}: {}", run.ctx.rank, e.what());
    if (auto* x = t.transport(run, 0)) x->abort(make_error(errc::runtime, "{}", t.results[0].error));
  }
  const std::vector<std::string>& thrown = others.join();
  for (int r = 1; r < R; ++r)
    if (!thrown[static_cast<std::size_t>(r)].empty()) {
      actors::run_result& failed = t.results[static_cast<std::size_t>(r)];
      failed.ok = false;
      failed.error = fmt::format("rank {}: {}", run.ctx.rank + r, thrown[static_cast<std::size_t>(r)]);
    }
  t.bar->finish();
  if (t.comms->enabled()) {
    const std::string table = t.comms->summary();
    log_info("comms_logger summary (rank {} of {}; nccl-tests bandwidths):\n{}", run.ctx.rank, t.world,
             table.empty() ? std::string("no collectives (one rank)") : table);
  }
  std::string errors;
  for (const auto& result : t.results)
    if (!result.ok) errors += (errors.empty() ? "" : "\n") + result.error;
  if (!errors.empty()) {
    // A lost process of a pipeline split over processes: say which stage it ran.
    if (run.ctx.rc.stages_across_processes() && run.job)
      if (auto lost = net::lost_rank_in(errors); lost && *lost < run.job->env.world_size)
        errors += fmt::format(" ({})", describe_rank_stages(run.ctx.rc, run.job->env.world_size, *lost));
    return fail_run(make_error(errc::runtime, "{}", errors), 1);
  }
  return 0;
}

} // namespace dsa::train
