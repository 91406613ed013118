// Starting a pipeline run; see run.hpp.
#include "actors/runtime_threads.hpp"
#include "actors/run.hpp"
#include "actors/run_actors.hpp"

#include "actors/coordinator_actor.hpp"
#include "actors/feeder_actor.hpp"
#include "actors/link_proxy_actor.hpp"
#include "actors/pipe_link.hpp"
#include "actors/optimizer_actor.hpp"
#include "actors/reducer_actor.hpp"
#include "actors/protocol/protocol.hpp"
#include "actors/stage_actor.hpp"
#include "actors/trace/trace_file.hpp"
#include "actors/tracer_actor.hpp"
#include "core/error.hpp"
#include "io/net/flight_recorder.hpp"
#include "kernels/cpu/openmp_threads.hpp"

#include <caf/all.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <variant>

namespace dsa::actors {

namespace {

caf::actor_system_config make_config(const run_options& options) {
  caf::actor_system_config cfg;
  announce_protocol(cfg);
  // Sharing sleeps on a condition variable when idle; stealing would poll and
  // take cores from the compute workers (CAF issue #1251).
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("scheduler.max-threads", options.scheduler_threads);
  cfg.set("logger.verbosity", caf::atom("quiet"));
  mark_runtime_threads(cfg); // no host wait on a device on its threads (core/device_waits.hpp)
  return cfg;
}

int tied_index(const run_parts& parts, std::uint32_t s) { return parts.tied.empty() ? -1 : parts.tied[s]; }

// The rank that names this process's trace file: its data-parallel rank, or with
// stages across processes its rank in the job.
int trace_rank(const run_options& options) {
  return options.placement.split() ? options.placement.here : options.dp.rank;
}

// The facts a trace reader needs beside the records (trace_file.hpp, info frame).
// The plan's edges go in as "edges" (the count) and "edge.<id>" = "<slots> <name>",
// so `dsactor trace check` can bound the slots in flight per edge.
std::vector<std::pair<std::string, std::string>> trace_info(const run_options& options, const trace_recorder& trace,
                                                            const slot_table& slots) {
  std::vector<std::pair<std::string, std::string>> info = {
      {"rank", std::to_string(trace_rank(options))},
      {"ranks", std::to_string(options.world ? options.world->size() : options.dp.size)},
      {"stages", std::to_string(options.pipeline.stages)},
      {"micro_batches", std::to_string(options.pipeline.micro_batches)},
      {"first_step", std::to_string(options.first_step)},
      {"origin_unix_ns", std::to_string(trace.origin_unix_ns())},
      {"origin_steady_ns", std::to_string(trace.origin_steady_ns())},
      {"boot_id", current_boot_id()},
      {"trace_interval_ms", std::to_string(options.trace_stream.interval.count())},
      {"edges", std::to_string(slots.edge_count())}};
  if (options.placement.split()) {
    // Stages across processes: which process ran each stage of this replica, and the
    // replica (trace_join.hpp merges a replica's processes into one trace).
    std::string where;
    for (int p : options.placement.process) where += (where.empty() ? "" : ",") + std::to_string(p);
    info.emplace_back("placement", where);
    info.emplace_back("replica", std::to_string(options.dp.rank));
  }
  for (std::uint32_t e = 0; e < slots.edge_count(); ++e)
    info.emplace_back(fmt::format("edge.{}", e), fmt::format("{} {}", slots.slot_count(e), slots.edge_name(e)));
  info.insert(info.end(), options.trace_facts.begin(), options.trace_facts.end());
  return info;
}

// run_result::trace: what the writer streamed to the file (the recorder kept
// only what came after its last drain) and those remaining records; with `from_step`,
// only the file's records of that step and later.
trace_data whole_trace(trace_writer* writer, trace_recorder& trace, run_result& result,
                       std::optional<std::uint32_t> from_step) {
  if (!writer) return trace.snapshot();
  if (auto finished = writer->finish(); !finished && result.trace_error.empty())
    result.trace_error = finished.err().to_string();
  auto rest = trace.snapshot();
  std::function<bool(const trace_record&)> keep;
  if (from_step) keep = [from = *from_step](const trace_record& r) { return r.step >= from; };
  auto read = read_trace(writer->path(), keep);
  if (!read) {
    if (result.trace_error.empty()) result.trace_error = read.err().to_string();
    return rest;
  }
  read->records.insert(read->records.end(), rest.records.begin(), rest.records.end());
  sort_trace_records(read->records);
  return std::move(*read);
}

// Holds arrivals from other processes until the local actors are wired.
class arrival_gate {
public:
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return open_; });
  }

private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

void spawn_and_run(const run_options& options, const run_parts& parts, const actor_setup& setup,
                   std::shared_ptr<run_summary> summary, trace_writer* writer, run_result& result) {
  auto cfg = make_config(options);
  caf::actor_system sys{cfg};
  const auto S = options.pipeline.stages;
  const auto& plan = *setup.plan;
  coordinator_args args;
  args.setup = setup;
  args.summary = summary;
  args.watchdog = options.watchdog;
  args.hooks = step_hooks{options.on_step, options.stop_after, options.local_figures};
  // Only a run with step hooks holds each update until the coordinator went on past the previous step.
  // Data-parallel coordinators, and those of one pipeline's processes, agree on every step before the next update.
  const auto release = args.hooks.holds_updates() || setup.dp.enabled() || plan.placement.split()
                           ? update_release::when_allowed
                           : update_release::immediately;
  // Stages of another process: their stage and reducer ids are proxies that send through the link.
  std::shared_ptr<pipe_link> link;
  if (plan.placement.split()) link = std::make_shared<pipe_link>(*options.world, setup.slots, plan.placement.peers());
  for (std::uint32_t s = 0; s < S; ++s) {
    if (!plan.local(s)) {
      const int process = plan.placement.process[s];
      args.stages.push_back(spawn_link_proxy(sys, link, process, plan.stage_id(s), plan.actor_name(plan.stage_id(s))));
      args.shards.emplace_back();
      args.reducers.push_back(
          spawn_link_proxy(sys, link, process, plan.reducer_id(s), plan.actor_name(plan.reducer_id(s))));
      continue;
    }
    args.stages.push_back(spawn_stage(sys, setup, s, parts.stages[s]));
    args.shards.push_back(spawn_optimizer(sys, setup, s, parts.optimizers[s], release));
    args.reducers.push_back(spawn_reducer(sys, setup, s, tied_index(parts, s), parts.optimizers[s]->gradient_parts(),
                                          parts.stages[s]->gradients_reduced(), &*parts.optimizers[s]));
  }
  args.feeder = spawn_feeder(sys, setup, parts.source);
  args.tracer = spawn_tracer(sys, writer);
  // Arrivals from other processes wait until the local actors know their peers (an actor
  // that answered before its wire_atom would send to nobody).
  auto gate = std::make_shared<arrival_gate>();
  args.wired = [gate] { gate->open(); };
  auto coordinator = spawn_coordinator(sys, args);
  if (link) {
    // Arrivals from the other processes go to this process's actors by plan id.
    std::map<std::uint32_t, caf::actor> here;
    for (std::uint32_t s = 0; s < S; ++s)
      if (plan.local(s)) {
        here[plan.stage_id(s)] = args.stages[s];
        here[plan.reducer_id(s)] = args.reducers[s];
      }
    link->start([here = std::move(here), gate, link_raw = link.get(),
                 plan_for_names = setup.plan](std::uint32_t target, const link_payload& m) {
      gate->wait();
      auto it = here.find(target);
      if (it == here.end()) {
        link_raw->abort(make_error(errc::protocol, "process {}: a pipeline message for actor {} ({}), which runs elsewhere",
                                   link_raw->process(), target, plan_for_names->actor_name(target)));
        return;
      }
      std::visit([&](const auto& msg) { caf::anon_send(it->second, msg); }, m);
    });
  }
  if (options.on_spawned) options.on_spawned(run_actors{coordinator, args.feeder, args.stages, args.shards, args.reducers});
  // This thread only waits from here on: its OpenMP pool (set-up's parallel loops) would
  // otherwise make libgomp throttle the stages' idle threads (compute_worker.hpp).
  cpu::release_openmp_threads();
  caf::scoped_actor self{sys};
  // The coordinator always answers (watchdog); the timeout is a last resort.
  const auto backstop = options.watchdog * 4 + std::chrono::seconds(60);
  self->request(coordinator, backstop, start_atom::value)
      .receive([&](done_atom) { result.ok = true; },
               [&](const caf::error& err) {
                 result.ok = false;
                 if (!summary->failure) summary->failure = failure_info{"coordinator", 0, sys.render(err)};
               });
  if (!result.ok) {
    // The actors may still run if the coordinator itself was lost: stop them.
    for (const auto& a : args.stages) caf::anon_send_exit(a, caf::exit_reason::kill);
    for (const auto& a : args.shards)
      if (a) caf::anon_send_exit(a, caf::exit_reason::kill);
    for (const auto& a : args.reducers) caf::anon_send_exit(a, caf::exit_reason::kill);
    caf::anon_send_exit(args.feeder, caf::exit_reason::kill);
    caf::anon_send_exit(args.tracer, caf::exit_reason::kill);
    caf::anon_send_exit(coordinator, caf::exit_reason::kill);
  }
  // The proxies of the other processes' actors quit with the run.
  for (std::uint32_t s = 0; s < S; ++s)
    if (!plan.local(s)) {
      caf::anon_send_exit(args.stages[s], caf::exit_reason::user_shutdown);
      caf::anon_send_exit(args.reducers[s], caf::exit_reason::user_shutdown);
    }
  // Every local actor is done: tell the other processes, wait for their end (arrivals
  // for actors that are gone are dropped), before the actor system goes.
  gate->open(); // also when the coordinator never started
  if (link) link->finish();
}

} // namespace

run_result run_pipeline(const run_options& options, const run_parts& parts) {
  const auto S = options.pipeline.stages;
  const auto& where = options.placement;
  DSA_CHECK(!where.split() || (where.process.size() == S && options.world && options.world->rank() == where.here),
            "run_pipeline: stages across processes need a process for each stage ({} named for {} stages) and this "
            "process's job transport",
            where.process.size(), S);
  DSA_CHECK(parts.stages.size() == S && parts.optimizers.size() == S && parts.source,
            "run_pipeline: {} stages need {} stage computes ({} given), optimizers ({} given) and a source", S,
            S, parts.stages.size(), parts.optimizers.size());
  for (std::uint32_t s = 0; s < S; ++s)
    DSA_CHECK((parts.stages[s] != nullptr) == where.local(s) && (parts.optimizers[s] != nullptr) == where.local(s),
              "run_pipeline: stage {} runs {}, so its compute and optimizer must be {}", s,
              where.local(s) ? "here" : "in another process", where.local(s) ? "given" : "null");
  DSA_CHECK(parts.tied.empty() || parts.tied.size() == S, "run_pipeline: {} tied indices for {} stages",
            parts.tied.size(), S);
  for (std::uint32_t s = 0; s < parts.tied.size(); ++s)
    DSA_CHECK(parts.tied[s] < 0 || s == 0 || s + 1 == S,
              "run_pipeline: stage {} holds the tied parameter; only the first and the last stage may", s);
  auto local = [&](std::uint32_t s) { return where.local(s); };
  pipeline_options shape = options.pipeline;
  shape.tied_ends = S > 1 && !parts.tied.empty() && parts.tied.front() >= 0 && parts.tied.back() >= 0;
  // With several ranks each stage's gradients go to the reducer in buckets (one
  // collective each, started as backward finishes them with dp.overlap); alone, in one.
  // A shard streams its update when it can (stream_elements) and a bucket is final once
  // its reducer has reduced it: no tied exchange still to change it, gradients not summed
  // by the stage itself. Its stage then publishes buckets of about that size. (Its
  // reducer then sends no reduced_early: the stream takes speculation's place.) Only this
  // process's stages are decided here; another process's never meet these actors.
  shape.streamed.assign(S, false);
  for (std::uint32_t s = 0; s < S; ++s) {
    if (!local(s)) continue;
    const bool tied_stage = shape.tied_ends && (s == 0 || s + 1 == S);
    shape.streamed[s] = parts.optimizers[s]->stream_elements() > 0 && !tied_stage &&
                        !parts.stages[s]->gradients_reduced();
  }
  const bool any_streamed = std::find(shape.streamed.begin(), shape.streamed.end(), true) != shape.streamed.end();
  if (options.dp.enabled() || any_streamed) {
    shape.grad_buckets.clear();
    for (std::uint32_t s = 0; s < S; ++s) {
      if (!local(s)) {
        shape.grad_buckets.emplace_back();
        continue;
      }
      std::vector<std::int64_t> sizes;
      for (const auto& p : parts.stages[s]->parameters()) sizes.push_back(p.numel());
      // A stage that sums its own gradients over the ranks publishes them in one bucket.
      std::int64_t limit = parts.stages[s]->gradients_reduced() ? std::numeric_limits<std::int64_t>::max()
                           : options.dp.enabled()            ? std::max<std::int64_t>(options.dp.bucket_elements, 1)
                                                             : std::numeric_limits<std::int64_t>::max();
      // With several ranks each bucket is one allreduce, whose order of adding depends on
      // the buffer: the buckets stay reduce_bucket_size's, so a streamed run sums exactly
      // as one that does not stream (the parts are then those buckets).
      if (shape.streamed[s] && !options.dp.enabled())
        limit = std::min(limit, parts.optimizers[s]->stream_elements());
      shape.grad_buckets.push_back(make_grad_buckets(sizes, limit));
    }
  }
  auto slots = std::make_shared<slot_table>();
  DSA_CHECK(options.dp.size >= 1 && options.dp.rank >= 0 && options.dp.rank < options.dp.size &&
                (!options.dp.enabled() || (options.dp.transport && options.dp.transport->size() == options.dp.size &&
                                           options.dp.transport->rank() == options.dp.rank)),
            "run_pipeline: data-parallel rank {} of {} needs that rank's transport", options.dp.rank, options.dp.size);
  auto plan = std::make_shared<const pipeline_plan>(
      make_plan(shape, *slots, options.first_step, options.dp.rank, options.dp.size, where));
  const bool tracing = options.trace == trace_mode::record;
  trace_recorder trace;
  for (std::uint32_t id = 0; id < plan->actor_count(); ++id) trace.set_actor_name(id, plan->actor_name(id));
  for (std::uint32_t s = 0; s < S; ++s)
    if (local(s))
      parts.optimizers[s]->trace_attach(tracing ? &trace : nullptr, plan->shard_id(s), static_cast<std::int32_t>(s));
  for (std::uint32_t s = 0; s < S; ++s)
    if (local(s))
      parts.stages[s]->trace_attach(tracing ? &trace : nullptr, plan->stage_id(s), static_cast<std::int32_t>(s));
  if (options.optimizers == optimizer_start::init_from_stages)
    for (std::uint32_t s = 0; s < S; ++s)
      if (local(s)) parts.optimizers[s]->init(parts.stages[s]->parameters());
  for (std::uint32_t s = 0; s < S; ++s) {
    if (!local(s)) continue;
    auto buffers = parts.optimizers[s]->gradient_buffers();
    const auto kept = parts.optimizers[s]->gradient_parts();
    auto params = parts.stages[s]->parameters();
    DSA_CHECK(buffers.size() == params.size() && (kept.empty() || kept.size() == params.size()),
              "run_pipeline: optimizer {} has {} gradient buffers and {} parts for {} parameters", s, buffers.size(),
              kept.size(), params.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      const bool fits = kept.empty() ? buffers[i].shape() == params[i].shape()
                                     : 0 <= kept[i].lo && kept[i].lo <= kept[i].hi && kept[i].hi <= params[i].numel() &&
                                           buffers[i].numel() == kept[i].hi - kept[i].lo;
      DSA_CHECK(buffers[i].type() == dtype::f32 && fits,
                "run_pipeline: optimizer {} gradient buffer {} is {}, parameter is {}", s, i, buffers[i].describe(),
                params[i].describe());
    }
    if (s < parts.tied.size() && parts.tied[s] >= 0) {
      const auto t = static_cast<std::size_t>(parts.tied[s]);
      DSA_CHECK(t < params.size(), "run_pipeline: stage {} tied index {} of {}", s, parts.tied[s], params.size());
      // The reducers add the tied gradients whole.
      DSA_CHECK(!shape.tied_ends || kept.empty() || (kept[t].lo == 0 && kept[t].hi == params[t].numel()),
                "run_pipeline: optimizer {} keeps only part of the tied gradient {}", s, t);
    }
    slots->at({plan->reduced_edges[s], 0}) = std::move(buffers);
  }

  run_result result;
  std::unique_ptr<trace_writer> writer;
  std::string open_error;
  if (!options.run_dir.empty() && tracing) {
    std::error_code ec;
    std::filesystem::create_directories(options.run_dir, ec);
    const int rank = trace_rank(options);
    const std::string name = rank == 0 ? "trace.dsat" : fmt::format("trace.rank{}.dsat", rank);
    result.trace_path = (std::filesystem::path(options.run_dir) / name).string();
    // Streamed from the start, so a killed run keeps its trace up to the last flush.
    auto opened = trace_writer::open(trace, result.trace_path, trace_info(options, trace, *slots), options.trace_stream);
    if (opened) writer = std::move(*opened);
    else open_error = opened.err().to_string();
  }
  // The flight recorder starts empty for this run; a hang or a stop writes it into the trace.
  net::flight_recorder::instance().clear();
  net::flight_recorder::instance().set_rank(trace_rank(options));
  auto summary = std::make_shared<run_summary>();
  spawn_and_run(options, parts,
                actor_setup{plan, slots, tracing ? &trace : nullptr, options.dp, where.split() ? options.world : nullptr},
                summary, writer.get(), result);
  // The actor system is gone: every actor and worker thread has ended.
  for (auto* optimizer : parts.optimizers)
    if (optimizer) optimizer->trace_detach(); // a run stopped early: its last records
  for (std::uint32_t s = 0; s < S; ++s)
    if (local(s)) parts.stages[s]->trace_attach(nullptr, plan->stage_id(s), static_cast<std::int32_t>(s));
  result.steps_completed = summary->steps_completed;
  result.losses = summary->losses;
  if (!result.losses.empty()) result.losses.resize(summary->steps_completed);
  result.last_loss = summary->last_loss;
  result.last_data_position = summary->last_position;
  result.trace_error = summary->trace_error;
  result.failure = summary->failure;
  if (result.failure) {
    result.ok = false;
    result.error = fmt::format("{} failed in step {}: {}", result.failure->actor, result.failure->step,
                               result.failure->why);
  }
  std::optional<std::uint32_t> from_step;
  if (options.result_trace_steps > 0 && result.steps_completed > options.result_trace_steps)
    from_step = plan->first_step + result.steps_completed - options.result_trace_steps;
  if (tracing) result.trace = whole_trace(writer.get(), trace, result, from_step);
  if (!open_error.empty()) result.trace_error = open_error;
  return result;
}

} // namespace dsa::actors
