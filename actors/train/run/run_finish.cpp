// The last phases of `dsactor run`'s training: finish (ZeRO-3's weights gathered back,
// the final checkpoint, the last swap writes, leaving the job) and report; see
// run_phases.hpp.
#include "actors/train/run/run_phases.hpp"

#include "actors/trace/analysis/chrome_export.hpp"
#include "actors/trace/trace_analysis.hpp"
#include "actors/train/run/communication_report.hpp"
#include "actors/train/eval/run_evaluate.hpp"
#include "actors/train/run/signals.hpp"
#include "actors/train/run/stage_states.hpp"
#include "core/log.hpp"

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <thread>

namespace dsa::train {

namespace {

// Runs `work(r)` for every rank r of the process on a thread of its own (rank_threads).
template <class Work>
std::vector<std::string> on_every_rank(opened_run& run, training& t, int ranks, Work work) {
  rank_threads threads(run, t, ranks);
  for (int r = 0; r < ranks; ++r) threads.start(r, [&work, r] { work(r); });
  return threads.join();
}

int first_error(const std::vector<std::string>& errors) {
  for (const auto& e : errors)
    if (!e.empty()) return fail_run(make_error(errc::runtime, "{}", e), 1);
  return 0;
}

// ZeRO-3: the stages hold partitions; every rank takes part in gathering the whole
// weights back (the evaluation reads them from rank 0's stages).
int gather_zero3_weights(opened_run& run, const run_plan& plan, process_ranks& ranks, training& t) {
  const run_config& rc = run.ctx.rc;
  for (std::uint32_t s = 0; s < rc.stages; ++s)
    if (const param_fetcher* f = run.ctx.stages[s] ? run.ctx.stages[s]->fetcher() : nullptr) {
      const fetch_stats st = f->stats();
      log_info("stage {}: ZeRO-3 fetcher of rank {}: gathered {} tensors ({:.2f} MiB) over the run; at most {} "
               "elements gathered at once (stage3_max_live_parameters {}); {} uses gathered ahead of the "
               "compute (stage3_prefetch_bucket_size {}), {} waited for; {} elements kept whole "
               "(stage3_param_persistence_threshold {})",
               s, run.ctx.rank, st.gathers,
               static_cast<double>(st.gathered_elements) * static_cast<double>(dtype_size(working_dtype(rc.working))) /
                   (1 << 20),
               st.peak_live_elements, rc.stage3_max_live, st.ahead, rc.stage3_prefetch, st.waits,
               f->persistent_elements(), rc.stage3_persistence);
    }
  const bool evaluates = plan.evaluates; // the whole weights are for the evaluation
  return first_error(on_every_rank(run, t, static_cast<int>(rc.ranks), [&](int r) {
    if (evaluates)
      for (auto& stage : ranks.context(run, r).stages)
        if (stage) stage->gather_whole();
  }));
}

// The final checkpoint (or the one a signal asked for): the shards hold that step's state.
// With ZeRO the other ranks' shards take part in gathering it, each on a thread of its own.
int save_final_checkpoint(opened_run& run, training& t, const finished& f) {
  const run_config& rc = run.ctx.rc;
  const int R = static_cast<int>(rc.ranks);
  rank_threads contributors(run, t, R);
  for (int r = 0; r < R; ++r) {
    rank_run& rr = t.runs[static_cast<std::size_t>(r)];
    if (run.ctx.rank + r == 0 || !t.zero || f.done <= rr.last_contributed) continue;
    contributors.start(r, [&rr, &rc, &f] {
      contribute_checkpoint(rr, rc.checkpoint.dir, static_cast<std::uint32_t>(f.done));
    });
  }
  std::optional<error> save_error;
  // Stages across processes: rank 0 writes the checkpoint with every stage's state, which
  // the other stages' owners send (the ranks agreed on the step, so each knows it is due).
  if (rc.stages_across_processes() && !run.lead && run.ctx.rank == 0 && f.done > t.last_sent) {
    try {
      send_stage_payloads(run, t, f.done);
    } catch (const std::exception& e) {
      return fail_run(make_error(errc::runtime, "{}", e.what()), 1);
    }
  }
  if (run.lead && f.done > t.reporter->last_saved()) {
    try {
      t.reporter->save(static_cast<std::uint32_t>(f.done), t.results[0].last_data_position);
    } catch (const std::exception& e) {
      save_error = make_error(errc::io, "{}", e.what());
    }
  }
  // Contributors still waiting in a gather rank 0 never entered: wake them.
  if (save_error && !contributors.empty())
    if (auto* x = t.transport(run, 0)) x->abort(*save_error);
  const std::vector<std::string>& contribution_errors = contributors.join();
  if (save_error) return fail_run(*save_error, 1);
  return first_error(contribution_errors);
}

} // namespace

int move_evaluation_weights(opened_run& run, const run_plan& plan) {
  const run_context& ctx = run.ctx;
  if (run.weights_moved || !ctx.rc.stages_across_processes() || !plan.evaluates || !evaluates_anything(ctx.rc))
    return 0;
  run.weights_moved = true;
  auto& world = *run.job->transport;
  auto moved = [&]() -> status {
    for (std::uint32_t s = 0; s < ctx.rc.stages; ++s) {
      if (run.lead && !ctx.local(s)) {
        DSA_ASSIGN_OR_RETURN(auto got, recv_named_tensors(world, ctx.placement.process[s]));
        run.weights_elsewhere.merge(got);
      } else if (!run.lead && ctx.rank == 0 && ctx.local(s)) {
        DSA_TRY(send_named_tensors(world, 0, evaluation_weights(*ctx.stages[s])));
      }
    }
    return run.job->client->barrier("evaluation weights");
  }();
  if (!moved) return fail_run(make_error(moved.err().code, "the final evaluation's weights: {}", moved.err().message), 1);
  return 0;
}

int finish_training(opened_run& run, const run_plan& plan, process_ranks& ranks, training& t, finished& f) {
  const run_config& rc = run.ctx.rc;
  const actors::run_result& result = t.results[0];
  if (rc.zero_stage >= 3 && rc.zero_partitions())
    if (int code = gather_zero3_weights(run, plan, ranks, t)) return code;
  f.done = static_cast<std::int64_t>(run.ctx.first_step) + result.steps_completed - 1;
  // Every rank agrees that the run ended early (the coordinators stop together), so
  // every rank takes the same decision even when the signal reached only some.
  const bool early = run.ctx.first_step + result.steps_completed <= run.ctx.last_step;
  f.stopped = stop_requested() || early; // also when the signal came during the last step
  // With several ranks the decision must be the same everywhere (a ZeRO checkpoint is
  // a collective): only what the ranks agreed on counts, not a signal one process got
  // during the last step.
  // (One process alone may go by its own signal; stages across processes have one
  // data-parallel rank but several processes, which must agree too.)
  const bool alone = !run.job || run.job->env.world_size == 1;
  const bool final_save = f.done >= 0 && (rc.checkpoint.save_final || early || (alone && stop_requested()));
  if (final_save)
    if (int code = save_final_checkpoint(run, t, f)) return code;
  // NVMe offload: the last update's writes behind it must have landed.
  for (auto& rr : t.runs)
    for (auto& shard : rr.shards)
      if (!shard) continue;
      else if (auto flushed = shard->flush_state(); !flushed)
        return fail_run(make_error(flushed.err().code, "the optimizer state's last swap: {}", flushed.err().message), 1);
  // The other processes need nothing more from this one once every one has finished its
  // part of the last collectives: a checkpoint's gathers end at different times on
  // different ranks, and a process that left while a peer was still in one would look
  // lost to it (its endpoints closing). Then leave the job cleanly.
  if (int code = move_evaluation_weights(run, plan)) return code;
  if (run.job) {
    if (auto s = run.job->client->barrier("end"); !s) return fail_run(s.err(), 1);
    if (auto s = run.job->client->leave(); !s) log_warn("leaving the job's rendezvous: {}", s.err().message);
  }
  return 0;
}

int report_training(const run_request& req, opened_run& run, training& t) {
  const run_context& ctx = run.ctx;
  const run_config& rc = ctx.rc;
  const actors::run_result& result = t.results[0];
  const auto M = static_cast<std::uint32_t>(rc.batch.gradient_accumulation);
  if (run.lead && !req.trace_chrome.empty()) { // rank 0's trace (the others' are trace.rank<r>.dsat)
    if (auto w = actors::write_chrome_trace(req.trace_chrome, result.trace); !w) return fail_run(w.err(), 1);
    log_info("wrote Chrome trace {}", req.trace_chrome);
  }
  if (rc.stages > 1 || M > 1) {
    double bubble = actors::theoretical_bubble(rc.stages, M);
    const std::string span = t.report_steps > 0 && result.steps_completed > t.report_steps
                                 ? fmt::format("the last {} steps", t.report_steps)
                                 : std::string("the run");
    // With stages across processes this process's trace holds only its stages, and the
    // step windows are theirs: the whole pipeline's view joins the processes' traces.
    for (const auto& idle : actors::stage_idle_fractions(result.trace, rc.stages, M))
      if (ctx.local(static_cast<std::uint32_t>(idle.stage)))
        log_info("stage {}: idle {:.1f}% of {}{} (1F1B bubble (S-1)/(M+S-1) = {:.1f}%)", idle.stage,
                 100 * idle.idle_fraction, span,
                 rc.stages_across_processes() ? " (within this process's step windows)" : "", 100 * bubble);
  }
  for (const auto& o : actors::allreduce_overlap(result.trace, rc.stages))
    log_info("stage {}: gradient allreduce {:.3f} s, {:.1f}% of it during the stage's backward{}", o.stage,
             o.allreduce_s, o.allreduce_s > 0 ? 100 * o.overlapped_s / o.allreduce_s : 0.0,
             rc.overlap_comm ? "" : " (overlap_comm is off)");
  std::vector<const model_shard*> shard_views, local_shards;
  for (const auto& shard : t.runs[0].shards) {
    shard_views.push_back(shard.get());
    if (shard) local_shards.push_back(shard.get());
  }
  log_info("training done: last loss {:.4f}, {} step(s) skipped", result.last_loss,
           local_shards.front()->decider().skipped());
  if (run.lead && t.world > 1) { // the bytes on the wire, against fp16 allreduce (communication_report.hpp)
    std::int64_t parameters = 0;
    for (std::uint32_t s = 0; s < rc.stages; ++s) // this process's stages
      if (ctx.local(s))
        for (const auto& spec : bert::parameter_specs(rc.model, ctx.ranges[s])) parameters += shape_numel(spec.shape);
    auto figures = communication_of(optim::optimizer_name(rc.optimizer.type), t.world,
                                    static_cast<std::int64_t>(result.steps_completed), local_shards, parameters,
                                    t.transport(run, 0)->bytes_sent());
    figures.shared_memory_allreduce = rc.ranks > 1 && rc.shared_memory_allreduce;
    log_info("{}", describe(figures));
    if (auto w = write_communication(rc.run_dir, figures); !w) log_warn("communication.json: {}", w.err().message);
  }
  if (t.global && rc.stages > 1 && run.lead) { // the shards of every rank speculate alike: rank 0's
    std::int64_t speculated = 0, rolled_back = 0;
    for (const auto* shard : local_shards) {
      speculated += shard->speculated();
      rolled_back += shard->rolled_back();
    }
    if (!rc.speculative_update)
      log_info("speculative update: off (pipeline.speculative_update = false)");
    else
      log_info("speculative update: {} shard update(s) started before the global norm, {} rolled back (clipped "
               "or overflowed) and redone", speculated, rolled_back);
  }
  const int R = static_cast<int>(rc.ranks);
  for (int r = 0; r < R; ++r) { // NVMe offload: one line per stage, one for the engine actor
    const rank_run& rr = t.runs[static_cast<std::size_t>(r)];
    const std::string rank = R > 1 ? fmt::format("rank {}: ", ctx.rank + r) : std::string();
    for (const auto& shard : rr.shards)
      if (!shard) continue;
      else if (auto line = shard->swap_report(); !line.empty()) log_info("{}{}", rank, line);
    if (rr.nvme) log_info("{}{}", rank, rr.nvme->report());
  }
  if (run.lead && !result.trace_path.empty())
    log_info("actor trace: {} (summarise it: dsactor trace {} summary)", result.trace_path, rc.run_dir);
  return 0;
}

} // namespace dsa::train
