// The run: configuration, data, stages, shards, restore, run, report.
#include "actors/train/trainer.hpp"

#include "kernels/cpu/gemm_bf16.hpp"
#include "kernels/cpu/isa.hpp"
#include "actors/train/run_context.hpp"
#include "actors/train/run_setup.hpp"

#include "actors/run.hpp"
#include "actors/trace/chrome_export.hpp"
#include "actors/trace/trace_analysis.hpp"
#include "actors/train/bert_optimizer.hpp"
#include "actors/train/communication_report.hpp"
#include "actors/train/bert_stage.hpp"
#include "actors/train/deepspeed_json.hpp"
#include "actors/train/job_membership.hpp"
#include "actors/train/feed_source.hpp"
#include "actors/train/memory_accounting.hpp"
#include "actors/train/memory_plan.hpp"
#include "actors/train/metrics.hpp"
#include "actors/train/progress.hpp"
#include "actors/train/run_checkpoint.hpp"
#include "actors/train/run_config.hpp"
#include "actors/train/signals.hpp"
#include "core/log.hpp"
#include "io/ckpt/atomic_file.hpp"
#include "io/net/local_transport.hpp"
#include "io/net/rendezvous_client.hpp"
#include "io/net/rendezvous_env.hpp"
#include "io/net/ucx_transport.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>

namespace dsa::train {

namespace {
namespace fs = std::filesystem;

std::string default_run_dir(const std::string& config_path) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  return fmt::format("runs/{}-{}", fs::path(config_path).stem().string(), stamp);
}

// --resume without a run_dir in the config: the newest runs/<config name>-<time> that
// holds a checkpoint (names sort by time).
expected<std::string> run_dir_to_resume(const std::string& config_path) {
  const std::string prefix = fs::path(config_path).stem().string() + "-";
  std::string best;
  std::error_code ec;
  for (fs::directory_iterator it("runs", ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) == 0 && fs::exists(it->path() / "checkpoints" / "latest") && name > best) best = name;
  }
  if (best.empty())
    return make_error(errc::not_found, "--resume: no earlier run of {} with a checkpoint under runs/{}* (set run_dir "
                      "or checkpoint.load)", config_path, prefix);
  return "runs/" + best;
}



int fail(const error& e, int code) {
  fmt::print(stderr, "dsactor run: {}\n", e.message);
  return code;
}

// Exit code 2 for a configuration error, whenever it is found; 1 for anything else.
int fail(const error& e) { return fail(e, e.code == errc::config ? 2 : 1); }

} // namespace

int run_training(const run_request& req) {
  install_stop_handlers();
  run_context ctx;
  auto loaded = load_run_config(req.config_path, req.deepspeed_config);
  if (!loaded) return fail(loaded.err(), 2);
  ctx.cfg = std::move(*loaded);
  // Every problem of the config and the --set flags is reported in one run.
  config_problems problems;
  for (const auto& o : req.overrides)
    if (auto s = ctx.cfg.set_override(o); !s)
      problems.add(s.err());
  if (req.resume)
    if (auto s = ctx.cfg.set_override("checkpoint.load=\"latest\""); !s)
      problems.add(s.err());
  std::string run_dir = default_run_dir(req.config_path);
  if (req.resume && !ctx.cfg.table().at_path("run_dir").node()) {
    // Not finding the run to resume is reported with the config's problems.
    if (auto earlier = run_dir_to_resume(req.config_path)) run_dir = *earlier;
    else problems.add(earlier.err());
  }
  // Under dsactor launch this process is one rank of a job of WORLD_SIZE processes.
  auto launched = net::read_rendezvous_env();
  if (!launched) return fail(launched.err(), 2);
  const int processes = *launched ? (*launched)->world_size : 1;
  ctx.rc = read_run_config(ctx.cfg, run_dir, problems, processes);
  if (auto s = problems.to_status(); !s)
    return fail(s.err(), 2);
  auto& rc = ctx.rc;
  // bf16.cpu_gemm: every GEMM of this run on bf16 operands (oneDNN), restored at its end.
  cpu::bf16_operands_scope bf16_gemm(rc.bf16_cpu_gemm);
  std::optional<job_membership> job;
  if (*launched) {
    auto joined = join_job(**launched, ctx.cfg);
    if (!joined) return fail(joined.err());
    job = std::move(*joined);
    ctx.rank = job->env.rank;
    // Every process writes into rank 0's run directory (a default name carries the time).
    auto dirs = job->client->allgather("run_dir", to_bytes(rc.run_dir));
    if (!dirs) return fail(dirs.err(), 1);
    const auto& first = dirs->front();
    rc.run_dir.assign(reinterpret_cast<const char*>(first.data()), first.size());
    if (!ctx.cfg.has("checkpoint.dir")) rc.checkpoint.dir = rc.run_dir + "/checkpoints";
    // Where the rendezvous server's steady clock stands against this process's: the trace
    // inspector puts the ranks of several hosts on that one clock (trace_clock.hpp).
    auto clock = job->client->estimate_server_clock();
    if (!clock) return fail(clock.err(), 1);
    ctx.trace_facts = {{"clock_reference", fmt::format("rendezvous server at {}:{}", job->env.master_addr, job->env.master_port)},
                       {"clock_reference_offset_ns", std::to_string(clock->offset_ns)},
                       {"clock_reference_error_ns", std::to_string(clock->error_ns)}};
  }
  const bool lead = ctx.rank == 0; // reports, saves, evaluates

  std::error_code ec;
  fs::create_directories(rc.run_dir, ec);
  if (ec) return fail(make_error(errc::io, "run_dir '{}': cannot create: {}", rc.run_dir, ec.message()), 1);
  const std::string log_name = lead ? "train.log" : fmt::format("train.rank{}.log", ctx.rank);
  if (!set_log_file(rc.run_dir + "/" + log_name))
    return fail(make_error(errc::io, "{}/{}: cannot open for writing", rc.run_dir, log_name), 1);
  struct log_file_closer {
    ~log_file_closer() { set_log_file(""); }
  } closer;
  const std::string effective = ctx.cfg.to_toml();
  if (lead)
    if (auto w = ckpt::write_file_atomic(rc.run_dir + "/config.toml", effective + "\n"); !w) return fail(w.err(), 1);
  log_info("dsactor run {} -> {}{}\neffective config:\n{}", rc.config_path, rc.run_dir,
           job ? fmt::format(" as rank {} of {} processes on host {}", ctx.rank, job->env.world_size, host_name())
               : std::string(),
           effective);
  log_info("{}{}", cpu::isa_report(),
           rc.bf16_cpu_gemm ? fmt::format("; GEMMs on bf16 operands through oneDNN {} (bf16.cpu_gemm)",
                                          cpu::bf16_gemm_implementation())
                            : std::string());

  // Rank 0 prepares the data (data.prepare) before the others look at it.
  if (job && !lead)
    if (auto s = job->client->barrier("data"); !s) return fail(s.err(), 1);
  auto v = load_vocab(ctx);
  if (!v) return fail(v.err());
  if (job && lead)
    if (auto s = job->client->barrier("data"); !s) return fail(s.err(), 1);
  tok::tokenizer_options to;
  if (!rc.data.lower_case) to.case_mode = tok::casing::keep;
  if (*v) ctx.tokenizer = std::make_unique<tok::bert_tokenizer>(std::move(**v), to);
  const std::int64_t rss_before_data = proc_status_bytes("VmRSS");
  if (auto s = make_provider(ctx); !s) return fail(s.err());
  log_info("model: {}; precision {}; batch {} = micro {} x accumulation {} x {} rank(s)", bert::describe(rc.model),
           precision_name(rc.working), rc.batch.train_batch_size, rc.batch.micro_batch_size,
           rc.batch.gradient_accumulation, rc.batch.data_parallel_size);
  std::int64_t total_steps = rc.train_steps;
  if (total_steps == 0)
    total_steps = static_cast<std::int64_t>(std::ceil(rc.epochs * static_cast<double>(ctx.provider->rows_per_epoch()) /
                                                      static_cast<double>(rc.batch.train_batch_size)));
  ctx.last_step = static_cast<std::uint32_t>(std::max<std::int64_t>(total_steps, 1) - 1);
  // limits.host_memory: refused here, before the stages and shards allocate anything.
  const bool could_move_weights = rc.host_memory > 0 && may_move_weights(rc); // the same in every process
  auto memory = plan_run_memory(ctx, rss_before_data);
  if (!memory) return fail(memory.err());
  // What every process of a job must do alike, from what each planned for itself.
  bool evaluates = memory->evaluation_fits(rc);
  if (job)
    if (auto agreed = agree_on_memory(*job->client, rc, could_move_weights, evaluates); !agreed)
      return fail(agreed.err(), 1);
  auto start0 = prepare_rank(ctx);
  if (!start0) return fail(start0.err());
  std::vector<rank_start> starts;
  starts.push_back(std::move(*start0));
  // Data-parallel ranks 1..R-1 of this process: the same config, each with its own
  // data provider (a copy at rank 0's position), stages, deciders and restored state.
  const int R = static_cast<int>(rc.ranks);
  std::vector<std::unique_ptr<run_context>> replicas;
  for (int r = 1; r < R; ++r) {
    auto c = std::make_unique<run_context>();
    c->rc = ctx.rc;
    c->cfg = ctx.cfg;
    c->tokenizer = ctx.tokenizer;
    c->provider = ctx.provider->clone();
    c->last_step = ctx.last_step;
    c->seq_length = ctx.seq_length;
    c->rank = ctx.rank + r;
    auto st = prepare_rank(*c);
    if (!st) return fail(st.err());
    starts.push_back(std::move(*st));
    replicas.push_back(std::move(c));
  }
  auto context_of = [&](int r) -> run_context& { return r == 0 ? ctx : *replicas[static_cast<std::size_t>(r - 1)]; };

  int status_code = 0;
  if (ctx.first_step <= ctx.last_step) {
    // Rows are numbered by completed steps: a resumed run keeps rows 1..first_step. Rank 0
    // alone writes them (and the progress, and checkpoints).
    std::optional<metrics_writer> metrics;
    if (lead) {
      auto m = starts[0].resumed ? metrics_writer::open_resumed(rc.run_dir, ctx.first_step)
                                 : metrics_writer::open(rc.run_dir);
      if (!m) return fail(m.err(), 1);
      metrics.emplace(std::move(*m));
    }
    progress bar(ctx.first_step, ctx.last_step + 1, lead ? rc.steps_per_print : 0, progress::detect_style());
    const auto M = static_cast<std::uint32_t>(rc.batch.gradient_accumulation);
    const bool global = rc.gradient_clipping > 0 || rc.working == precision::f16;
    log_info("optimizer updates: {}", global ? "after the reducers exchanged every stage's gradient norm "
                                               "(gradient clipping or loss scaling need it)"
                                             : "each stage's as soon as its gradients are reduced (no clipping, "
                                               "no loss scaling)");
    if (rc.speculative_update && !(global && rc.stages > 1))
      log_info("speculative update: nothing to speculate on ({})",
               global ? "one stage: the global norm is known with its gradients" : "no global norm to wait for");
    const int world = static_cast<int>(rc.batch.data_parallel_size);
    const char* zero_held =
        rc.zero_stage >= 3   ? "the working weights (each layer's gathered as it runs), the optimizer state and the reduced gradients"
        : rc.zero_stage >= 2 ? "the optimizer state and the reduced gradients"
                             : "the optimizer state";
    if (world > 1)
      log_info("data parallel: {} ranks{}; gradients summed over them in buckets of up to {} elements, "
               "{} ({})",
               world, job ? " (one per process)" : " in this process", rc.reduce_bucket_elements,
               rc.overlap_comm ? "each started as backward finishes it (overlap_comm)" : "after the step's backward",
               rc.zero_stage >= 1 ? fmt::format("ZeRO stage {}: each rank holds {} of 1/{} of the parameters",
                                                rc.zero_stage, zero_held, world)
                                  : std::string("ZeRO stage 0: every rank holds the whole optimizer state"));
    if (world > 1 && !rc.zero_note.empty()) log_info("{}", rc.zero_note);
    std::unique_ptr<net::local_group> group;
    // One rank with ZeRO-3 (offload_param on NVMe) still needs a transport for its
    // fetcher's and shard's communicators: a group of one.
    if (R > 1 || (!job && rc.zero_partitions())) group = std::make_unique<net::local_group>(R);
    // Rank r's transport to the others: UCX between processes, or the in-process group.
    auto transport_of = [&](int r) -> net::transport* {
      if (job) return job->transport.get();
      return group ? &group->at(r) : nullptr;
    };
    // ZeRO stages 1 and 2: each rank's shards hold 1/world of the optimizer state.
    // Every rank writes files of its own into a checkpoint: with ZeRO its optimizer
    // partition, with a compressed optimizer its 1-bit error buffers.
    const bool zero = (rc.zero_partitions() || rc.optimizer.compressed()) && world > 1;
    // comms_logger: this process's first rank's collectives (every rank issues the same ones).
    net::comms_logger comms(rc.comms_logger, world);
    std::vector<rank_run> runs;
    for (int r = 0; r < R; ++r) {
      auto rr = make_rank_run(context_of(r), starts[static_cast<std::size_t>(r)], transport_of(r),
                              r == 0 && world > 1 ? &comms : nullptr);
      if (!rr) return fail(rr.err(), 1);
      runs.push_back(std::move(*rr));
    }
    std::vector<const bert_optimizer*> shard_views;
    for (const auto& shard : runs[0].shards) shard_views.push_back(shard.get());
    std::optional<step_reporter> reporter;
    if (lead) reporter.emplace(ctx, *metrics, bar, shard_views);
    actors::run_options ro;
    ro.pipeline.stages = rc.stages;
    ro.pipeline.micro_batches = M;
    ro.pipeline.steps = ctx.last_step - ctx.first_step + 1;
    ro.pipeline.schedule = rc.schedule == "gpipe" ? actors::schedule_kind::gpipe : actors::schedule_kind::one_f_one_b;
    ro.pipeline.totals = global ? actors::grad_scope::global : actors::grad_scope::per_stage;
    ro.pipeline.speculative_update = rc.speculative_update;
    ro.first_step = ctx.first_step;
    if (starts[0].resumed) ro.optimizers = actors::optimizer_start::already_loaded;
    // The shards wait for each on_step to return before their next update (step_hooks.hpp);
    // with several ranks the coordinators stop when any rank is asked to.
    ro.stop_after = [&](std::uint32_t k) { return stop_requested() && k != ctx.last_step; };
    ro.watchdog = std::chrono::seconds(rc.watchdog_seconds);
    ro.run_dir = rc.run_dir;
    ro.trace_facts = ctx.trace_facts;
    // comms_logger: this process's first rank's collectives (every rank issues the same ones).
    auto options_of = [&](int r) {
      actors::run_options o = ro;
      const int global = ctx.rank + r;
      if (global == 0) o.on_step = [&](const actors::step_summary& summary) { reporter->on_step(summary); };
      if (world > 1)
        o.dp = {global, world, transport_of(r), rc.reduce_bucket_elements, rc.overlap_comm, r == 0 ? &comms : nullptr,
                rc.shared_memory_allreduce};
      // With ZeRO a checkpoint gathers the optimizer state from every rank's shards:
      // the ranks that do not write it take part in the same steps.
      if (global != 0 && zero)
        o.on_step = [&, r](const actors::step_summary& summary) {
          if (checkpoint_due(context_of(r), summary.step)) contribute_checkpoint(runs[static_cast<std::size_t>(r)], rc.checkpoint.dir, summary.step);
        };
      return o;
    };
    std::vector<actors::run_result> results(static_cast<std::size_t>(R));
    std::vector<std::thread> threads;
    for (int r = 1; r < R; ++r)
      threads.emplace_back([&, r] {
        results[static_cast<std::size_t>(r)] = actors::run_pipeline(options_of(r), runs[static_cast<std::size_t>(r)].parts);
      });
    results[0] = actors::run_pipeline(options_of(0), runs[0].parts);
    for (auto& t : threads) t.join();
    bar.finish();
    const actors::run_result& result = results[0];
    if (comms.enabled()) {
      const std::string table = comms.summary();
      log_info("comms_logger summary (rank {} of {}; nccl-tests bandwidths):\n{}", ctx.rank, world,
               table.empty() ? std::string("no collectives (one rank)") : table);
    }
    std::string errors;
    for (int r = 0; r < R; ++r)
      if (!results[static_cast<std::size_t>(r)].ok)
        errors += (errors.empty() ? "" : "\n") + results[static_cast<std::size_t>(r)].error;
    if (!errors.empty()) return fail(make_error(errc::runtime, "{}", errors), 1);
    // ZeRO-3: the stages hold partitions; every rank takes part in gathering the whole
    // weights back (the evaluation reads them from rank 0's stages).
    if (rc.zero_stage >= 3 && rc.zero_partitions()) {
      for (std::uint32_t s = 0; s < rc.stages; ++s)
        if (const param_fetcher* f = ctx.stages[s]->fetcher()) {
          const fetch_stats st = f->stats();
          log_info("stage {}: ZeRO-3 fetcher of rank {}: gathered {} tensors ({:.2f} MiB) over the run; at most {} "
                   "elements gathered at once (stage3_max_live_parameters {}); {} uses gathered ahead of the "
                   "compute (stage3_prefetch_bucket_size {}), {} waited for; {} elements kept whole "
                   "(stage3_param_persistence_threshold {})",
                   s, ctx.rank, st.gathers,
                   static_cast<double>(st.gathered_elements) * static_cast<double>(dtype_size(working_dtype(rc.working))) /
                       (1 << 20),
                   st.peak_live_elements, rc.stage3_max_live, st.ahead, rc.stage3_prefetch, st.waits,
                   f->persistent_elements(), rc.stage3_persistence);
        }
      std::vector<std::string> gather_errors(static_cast<std::size_t>(R));
      std::vector<std::thread> gathers;
      for (int r = 0; r < R; ++r)
        gathers.emplace_back([&, r] {
          try {
            if (evaluates) // the whole weights are for the evaluation
              for (auto& stage : context_of(r).stages) stage->gather_whole();
          } catch (const std::exception& e) {
            gather_errors[static_cast<std::size_t>(r)] = e.what();
            if (auto* t = transport_of(r)) t->abort(make_error(errc::runtime, "rank {}: {}", ctx.rank + r, e.what()));
          }
        });
      for (auto& t : gathers) t.join();
      for (const auto& e : gather_errors)
        if (!e.empty()) return fail(make_error(errc::runtime, "{}", e), 1);
    }
    // The final checkpoint (or the one a signal asked for): the shards hold that step's state.
    const std::int64_t done = static_cast<std::int64_t>(ctx.first_step) + result.steps_completed - 1;
    // Every rank agrees that the run ended early (the coordinators stop together), so
    // every rank takes the same decision even when the signal reached only some.
    const bool early = ctx.first_step + result.steps_completed <= ctx.last_step;
    const bool stopped = stop_requested() || early; // also when the signal came during the last step
    // With several ranks the decision must be the same everywhere (a ZeRO checkpoint is
    // a collective): only what the ranks agreed on counts, not a signal one process got
    // during the last step.
    const bool final_save =
        done >= 0 && (rc.checkpoint.save_final || early || (world == 1 && stop_requested()));
    // With ZeRO the other ranks' shards take part in gathering the state (their own threads).
    std::vector<std::thread> contributors;
    std::vector<std::string> contribution_errors(static_cast<std::size_t>(R));
    for (int r = 0; r < R; ++r) {
      rank_run& run = runs[static_cast<std::size_t>(r)];
      if (ctx.rank + r == 0 || !final_save || !zero || done <= run.last_contributed)
        continue;
      contributors.emplace_back([&, r] {
        try {
          contribute_checkpoint(runs[static_cast<std::size_t>(r)], rc.checkpoint.dir, static_cast<std::uint32_t>(done));
        } catch (const std::exception& e) {
          contribution_errors[static_cast<std::size_t>(r)] = e.what();
          // Ranks still waiting in a gather this one left: wake them.
          if (auto* t = transport_of(r)) t->abort(make_error(errc::runtime, "rank {}: {}", ctx.rank + r, e.what()));
        }
      });
    }
    std::optional<error> save_error;
    if (lead && final_save && done > reporter->last_saved()) {
      try {
        reporter->save(static_cast<std::uint32_t>(done), result.data_positions.back());
      } catch (const std::exception& e) {
        save_error = make_error(errc::io, "{}", e.what());
      }
    }
    // Contributors still waiting in a gather rank 0 never entered: wake them.
    if (save_error && !contributors.empty())
      if (auto* t = transport_of(0)) t->abort(*save_error);
    for (auto& t : contributors) t.join();
    if (save_error) return fail(*save_error, 1);
    for (const auto& e : contribution_errors)
      if (!e.empty()) return fail(make_error(errc::runtime, "{}", e), 1);
    // NVMe offload: the last update's writes behind it must have landed.
    for (auto& run : runs)
      for (auto& shard : run.shards)
        if (auto flushed = shard->flush_state(); !flushed)
          return fail(make_error(flushed.err().code, "the optimizer state's last swap: {}", flushed.err().message), 1);
    // The other processes need nothing more from this one once every one has finished its
    // part of the last collectives: a checkpoint's gathers end at different times on
    // different ranks, and a process that left while a peer was still in one would look
    // lost to it (its endpoints closing). Then leave the job cleanly.
    if (job) {
      if (auto s = job->client->barrier("end"); !s) return fail(s.err(), 1);
      if (auto s = job->client->leave(); !s) log_warn("leaving the job's rendezvous: {}", s.err().message);
    }
    if (lead && !req.trace_chrome.empty()) { // rank 0's trace (the others' are trace.rank<r>.dsat)
      if (auto w = actors::write_chrome_trace(req.trace_chrome, result.trace); !w) return fail(w.err(), 1);
      log_info("wrote Chrome trace {}", req.trace_chrome);
    }
    if (rc.stages > 1 || M > 1) {
      double bubble = actors::theoretical_bubble(rc.stages, M);
      for (const auto& idle : actors::stage_idle_fractions(result.trace, rc.stages, M))
        log_info("stage {}: idle {:.1f}% of the run (1F1B bubble (S-1)/(M+S-1) = {:.1f}%)", idle.stage,
                 100 * idle.idle_fraction, 100 * bubble);
    }
    for (const auto& o : actors::allreduce_overlap(result.trace, rc.stages))
      log_info("stage {}: gradient allreduce {:.3f} s, {:.1f}% of it during the stage's backward{}", o.stage,
               o.allreduce_s, o.allreduce_s > 0 ? 100 * o.overlapped_s / o.allreduce_s : 0.0,
               rc.overlap_comm ? "" : " (overlap_comm is off)");
    log_info("training done: last loss {:.4f}, {} step(s) skipped", result.losses.empty() ? 0.0 : result.losses.back(),
             runs[0].shards.front()->decider().skipped());
    if (lead && world > 1) { // the bytes on the wire, against fp16 allreduce (communication_report.hpp)
      std::int64_t parameters = 0;
      for (std::uint32_t s = 0; s < rc.stages; ++s)
        for (const auto& spec : bert::parameter_specs(rc.model, ctx.ranges[s])) parameters += shape_numel(spec.shape);
      auto figures = communication_of(optim::optimizer_name(rc.optimizer.type), world,
                                      static_cast<std::int64_t>(result.losses.size()), shard_views, parameters,
                                      transport_of(0)->bytes_sent());
      figures.shared_memory_allreduce = R > 1 && rc.shared_memory_allreduce;
      log_info("{}", describe(figures));
      if (auto w = write_communication(rc.run_dir, figures); !w) log_warn("communication.json: {}", w.err().message);
    }
    if (global && rc.stages > 1 && lead) { // the shards of every rank speculate alike: rank 0's
      std::int64_t speculated = 0, rolled_back = 0;
      for (const auto& shard : runs[0].shards) {
        speculated += shard->speculated();
        rolled_back += shard->rolled_back();
      }
      if (!rc.speculative_update)
        log_info("speculative update: off (pipeline.speculative_update = false)");
      else
        log_info("speculative update: {} shard update(s) started before the global norm, {} rolled back (clipped "
                 "or overflowed) and redone", speculated, rolled_back);
    }
    for (int r = 0; r < R; ++r) { // NVMe offload: one line per stage, one for the engine actor
      const rank_run& run = runs[static_cast<std::size_t>(r)];
      const std::string rank = R > 1 ? fmt::format("rank {}: ", ctx.rank + r) : std::string();
      for (const auto& shard : run.shards)
        if (auto line = shard->swap_report(); !line.empty()) log_info("{}{}", rank, line);
      if (run.nvme) log_info("{}{}", rank, run.nvme->report());
    }
    if (lead && !result.trace_path.empty())
      log_info("actor trace: {} (summarise it: dsactor trace {} summary)", result.trace_path, rc.run_dir);
    if (stopped) {
      log_memory_report(rc, *memory);
      log_info("stopped by signal after step {}; resume with: dsactor run {} --resume", done + 1, req.config_path);
      return 130;
    }
  } else {
    log_info("nothing to train: the checkpoint is at step {} of {}", ctx.first_step, ctx.last_step + 1);
  }
  if (lead && !evaluates)
    log_warn("final evaluation skipped: it would hold the whole model's weights and gradients and one rank's "
             "activations, {}, beside the model states: a peak of {}{}, more than limits.host_memory {}; to "
             "evaluate the final checkpoint, resume it with a larger budget (the run, with nothing left to train, "
             "evaluates)",
             format_bytes(memory->evaluation), format_bytes(memory->evaluation_peak()),
             memory->evaluation_fits(rc) ? " in another process" : "", format_bytes(rc.host_memory));
  if (lead && evaluates) status_code = evaluate(ctx);
  log_memory_report(rc, *memory); // the evaluation included
  return status_code;
}

} // namespace dsa::train
