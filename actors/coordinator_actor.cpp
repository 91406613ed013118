// The coordinator actor; see coordinator_actor.hpp.
#include "actors/coordinator_actor.hpp"

#include "actors/compute_worker.hpp"
#include "actors/data_parallel.hpp"
#include "actors/protocol/protocol.hpp"
#include "actors/worker_job.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "io/net/flight_recorder.hpp"

#include <caf/all.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <map>
#include <string>

namespace dsa::actors {

namespace {

enum class coord_phase { idle, running, stopping, done };

const char* phase_name(coord_phase p) {
  switch (p) {
    case coord_phase::idle: return "idle";
    case coord_phase::running: return "running";
    case coord_phase::stopping: return "stopping";
    case coord_phase::done: return "done";
  }
  return "?";
}

// What the coordinator gathers about one step until it completes.
struct open_step {
  double loss = 0;                    // mean micro-batch loss (the last stage's report)
  std::uint32_t reports = 0;          // stage and update reports
  std::vector<double> shares;         // [s]: stage s's gradient sum of squares
  bool skipped = false;               // some shard skipped the update
  std::vector<double> metrics;        // the last stage's summed forward metrics
  std::vector<std::uint64_t> position; // the data source's position after the step
  std::vector<bool> stage_seen, update_seen; // [s]: that report of stage s arrived
};

struct coordinator_state {
  coordinator_args args;
  coord_phase phase = coord_phase::idle;
  caf::response_promise promise;
  std::map<caf::actor_addr, std::uint32_t> ids; // monitored actor -> plan actor id
  std::vector<caf::actor> alive;
  std::vector<std::uint32_t> stage_steps;  // per stage: the absolute step it works on (completed ones + first_step)
  // The reports of each step not yet complete, by absolute step; a step's entry goes when it
  // completes, so the coordinator's memory does not grow with the run's length.
  std::map<std::uint32_t, open_step> open;
  std::uint32_t completed_below = 0; // every step below this one completed
  std::chrono::steady_clock::time_point last_progress;
  std::chrono::steady_clock::time_point last_step_done; // the previous step's completion (the start at first)
  bool hook_running = false; // the step hooks of a step run on `hooks`
  // Data parallelism: the hook thread's channel to the other ranks' coordinators.
  std::shared_ptr<net::communicator> peers;

  compute_worker hooks;      // last: joined first. Runs the step hooks off the CAF threads
};
using coordinator_actor = caf::stateful_actor<coordinator_state>;

// The entry of a step not yet complete, made on its first report.
// The step's loss into the summary: the last one, and every one when kept.
void record_loss(coordinator_state& st, std::uint32_t step, double loss) {
  run_summary& s = *st.args.summary;
  s.last_loss = loss;
  const std::uint32_t i = step - st.args.setup.plan->first_step;
  if (i < s.losses.size()) s.losses[i] = loss;
}

open_step& open_step_of(coordinator_state& st, std::uint32_t step) {
  auto [it, made] = st.open.try_emplace(step);
  if (made) {
    const auto S = st.args.setup.plan->options.stages;
    it->second.shares.assign(S, 0.0);
    it->second.stage_seen.assign(S, false);
    it->second.update_seen.assign(S, false);
  }
  return it->second;
}

void set_phase(coordinator_actor* self, coord_phase next) {
  log_debug("coordinator: {} -> {}", phase_name(self->state.phase), phase_name(next));
  self->state.phase = next;
}

void finish(coordinator_actor* self) {
  auto& st = self->state;
  auto summary = st.args.summary;
  auto deliver = [=](const std::string& trace_error) {
    auto& s = self->state;
    s.args.summary->trace_error = trace_error;
    if (s.args.summary->failure) {
      const auto& f = *s.args.summary->failure;
      s.promise.deliver(make_failure(runtime_errc::actor_down, f));
    } else {
      s.promise.deliver(done_atom::value);
    }
    set_phase(self, coord_phase::done);
    caf::anon_send_exit(s.args.tracer, caf::exit_reason::user_shutdown);
    self->quit();
  };
  self->request(st.args.tracer, std::chrono::seconds(30), flush_atom::value)
      .then([=](const std::string& err) { deliver(err); },
            [=](const caf::error& err) { deliver("tracer: " + self->system().render(err)); });
}

void stop_all(coordinator_actor* self) {
  auto& st = self->state;
  set_phase(self, coord_phase::stopping);
  for (const auto& a : st.alive) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  if (st.alive.empty() && !st.hook_running) finish(self);
}

// The run reached its last step: every actor confirms that the slots it wrote are all back
// (drain_atom, answered once the last release came: one from another process's actor may
// still be on its way, and would reach an actor that has exited), then stop_all. An answer
// that does not come within half the watchdog's time (before the watchdog would call the
// finished run stuck) is logged, naming the actor, and not waited for; any other error means
// the actor went down, and its down message fails the run.
void drain_then_stop(coordinator_actor* self) {
  auto& st = self->state;
  auto waiting = std::make_shared<std::size_t>(st.alive.size());
  if (*waiting == 0) return stop_all(self);
  auto answered = [self, waiting] {
    if (--*waiting == 0 && self->state.phase == coord_phase::running) stop_all(self);
  };
  for (const caf::actor& a : st.alive) {
    const auto id = st.ids.find(a.address());
    const std::string name = id != st.ids.end() ? st.args.setup.plan->actor_name(id->second) : "an actor";
    self->request(a, st.args.watchdog / 2, drain_atom::value)
        .then([answered](done_atom) { answered(); },
              [self, answered, name](const caf::error& e) {
                if (e != caf::sec::request_timeout) return; // went down: on_down fails the run
                log_warn("coordinator: {} did not confirm that the slots it wrote came back: {}", name,
                         self->system().render(e));
                answered();
              });
  }
}

void fail(coordinator_actor* self, failure_info info) {
  auto& st = self->state;
  if (st.phase != coord_phase::running) return;
  log_error("{} failed in step {}: {}", info.actor, info.step, info.why);
  // What this process was in when it failed (the watchdog, a lost peer), before the abort
  // below ends its collectives: the trace writer writes it (dsactor trace hang).
  net::flight_recorder::instance().capture(fmt::format("{} failed in step {}: {}", info.actor, info.step, info.why));
  // The other ranks would wait for this one in their next collective: wake them.
  if (auto* t = st.args.setup.job())
    t->abort(make_error(errc::runtime, "rank {} failed: {} failed in step {}: {}", t->rank(), info.actor, info.step,
                        info.why));
  st.args.summary->failure = std::move(info);
  stop_all(self);
}

// The oldest step a stage of this process works on.
std::uint32_t oldest_step(const coordinator_state& st) {
  const auto& plan = *st.args.setup.plan;
  std::uint32_t oldest = ~0u;
  for (std::uint32_t s = 0; s < plan.options.stages; ++s)
    if (plan.local(s)) oldest = std::min(oldest, st.stage_steps[s]);
  return oldest;
}

std::uint32_t local_stage_count(const pipeline_plan& plan) {
  std::uint32_t n = 0;
  for (std::uint32_t s = 0; s < plan.options.stages; ++s) n += plan.local(s) ? 1 : 0;
  return n;
}

std::uint32_t current_step(const coordinator_state& st, std::uint32_t id) {
  const auto& plan = *st.args.setup.plan;
  const auto S = plan.options.stages;
  if (id >= plan.stage_id(0) && id < plan.stage_id(0) + S) return st.stage_steps[id - plan.stage_id(0)];
  if (id >= plan.shard_id(0) && id < plan.shard_id(0) + S) return st.stage_steps[id - plan.shard_id(0)];
  if (id >= plan.reducer_id(0) && id < plan.reducer_id(0) + S) return st.stage_steps[id - plan.reducer_id(0)];
  return oldest_step(st);
}

// Stages across processes: the step's figures of the whole pipeline, from every
// process of the job. Each process adds what it holds and zeros elsewhere (x + 0 is
// exact), so the sums are those of one process running every stage: the loss and the
// metrics of the last stages (one per replica, summed in replica order), each stage's
// sum of squares and the local figures from replica 0 (every replica holds the same
// sums of squares after the reduction; the figures are its stages' own).
void sum_over_pipeline(net::communicator& world, const pipeline_plan& plan, step_summary& summary,
                       const std::vector<double>& shares, net::comms_logger* logger, const std::string& caller) {
  const auto S = plan.options.stages;
  const bool last_here = plan.local(S - 1);
  std::vector<double> head{last_here ? summary.loss : 0.0, summary.skipped ? 1.0 : 0.0,
                           last_here ? static_cast<double>(summary.metrics.size()) : 0.0};
  for (std::uint32_t s = 0; s < S; ++s) head.push_back(plan.local(s) && plan.dp_rank == 0 ? shares[s] : 0.0);
  for (double f : summary.figures) head.push_back(plan.dp_rank == 0 ? f : 0.0);
  auto sums = sum_over_ranks(world, head, logger, caller);
  if (!sums) throw std::runtime_error(fmt::format("summing the step's loss over the processes: {}", sums.err().message));
  summary.loss = (*sums)[0] / plan.dp_size;
  summary.skipped = (*sums)[1] > 0;
  const auto metric_count = static_cast<std::size_t>((*sums)[2] / plan.dp_size + 0.5);
  summary.grad_sum_of_squares = 0;
  for (std::uint32_t s = 0; s < S; ++s) summary.grad_sum_of_squares += (*sums)[3 + s]; // stage order
  for (std::size_t i = 0; i < summary.figures.size(); ++i) summary.figures[i] = (*sums)[3 + S + i];
  if (metric_count == 0) {
    summary.metrics.clear();
    return;
  }
  std::vector<double> metrics = last_here ? summary.metrics : std::vector<double>{};
  metrics.resize(metric_count, 0.0);
  auto metric_sums = sum_over_ranks(world, metrics, logger, caller);
  if (!metric_sums)
    throw std::runtime_error(fmt::format("summing the step's metrics over the processes: {}", metric_sums.err().message));
  summary.metrics = std::move(*metric_sums);
}

void on_down(coordinator_actor* self, const caf::down_msg& dm) {
  auto& st = self->state;
  auto it = st.ids.find(dm.source);
  if (it == st.ids.end()) return;
  const std::uint32_t id = it->second;
  st.alive.erase(std::remove_if(st.alive.begin(), st.alive.end(),
                                [&](const caf::actor& a) { return a.address() == dm.source; }),
                 st.alive.end());
  if (st.phase == coord_phase::running) {
    failure_info info;
    if (!read_failure(dm.reason, info))
      info = {st.args.setup.plan->actor_name(id), current_step(st, id),
              dm.reason ? self->system().render(dm.reason) : "exited before the run finished"};
    fail(self, info);
  }
  if (st.phase == coord_phase::stopping && st.alive.empty() && !st.hook_running) finish(self);
}

// Every stage and shard finished `step`: report it, then stop or go on.
void on_step_complete(coordinator_actor* self, std::uint32_t step) {
  auto& st = self->state;
  const auto& plan = *st.args.setup.plan;
  const auto& hooks = st.args.hooks;
  const auto now = std::chrono::steady_clock::now();
  open_step done = std::move(st.open.at(step));
  st.open.erase(step);
  st.completed_below = std::max(st.completed_below, step + 1);
  double sum_of_squares = 0;
  for (double share : done.shares) sum_of_squares += share; // stage order
  st.args.summary->last_position = done.position;
  step_summary summary{step, done.loss,
                             std::chrono::duration<double>(now - st.last_step_done).count(), sum_of_squares,
                             done.skipped, std::move(done.metrics), std::move(done.position), {}};
  st.last_step_done = now;
  st.args.summary->steps_completed = step + 1 - plan.first_step;
  log_debug("step {} done, loss {}, {:.3f} s", step, summary.loss, summary.wall_s);
  if (!hooks.on_step && !hooks.stop_after && !st.peers) {
    if (step + 1 == plan.end_step()) drain_then_stop(self);
    return;
  }
  // The hooks (metrics, progress, checkpoint writes with their fsyncs) run on
  // the coordinator's own thread, so no CAF scheduler thread blocks on them; the
  // next step's updates wait for their result (on_hooks_done). With data
  // parallelism the ranks first sum the step's loss and metrics (the hooks see
  // the group's), and afterwards stop when any rank asks to.
  st.hook_running = true;
  post_job(self, st.hooks, step,
           [hooks, summary, step, peers = st.peers, logger = st.args.setup.dp.logger, layout = st.args.setup.plan,
            shares = std::move(done.shares), caller = plan.actor_name(pipeline_plan::coordinator_id)]() mutable {
    if (hooks.local_figures) summary.figures = hooks.local_figures(step);
    if (peers && layout->placement.split()) {
      sum_over_pipeline(*peers, *layout, summary, shares, logger, caller);
    } else if (peers) {
      std::vector<double> local = summary.metrics;
      local.push_back(summary.loss);
      auto sums = sum_over_ranks(*peers, local, logger, caller);
      if (!sums)
        throw std::runtime_error(fmt::format("summing the step's loss over the ranks: {}", sums.err().message));
      summary.loss = sums->back() / peers->size();
      sums->pop_back();
      summary.metrics = std::move(*sums);
    }
    if (hooks.on_step) hooks.on_step(summary);
    bool stop = hooks.stop_after && hooks.stop_after(step);
    if (peers) {
      auto any = any_rank(*peers, stop, logger, caller);
      if (!any) throw std::runtime_error(fmt::format("agreeing with the other ranks on stopping: {}", any.err().message));
      stop = *any;
    }
    return work_done{stop ? 1u : 0u, step, 0, summary.loss, {}, {}};
  });
}

// The hooks of `step` returned; kind 1: stop_after asked to end the run.
void on_hooks_done(coordinator_actor* self, const work_done& d) {
  auto& st = self->state;
  const auto& plan = *st.args.setup.plan;
  st.hook_running = false;
  st.last_progress = std::chrono::steady_clock::now(); // a long hook (a checkpoint) is progress
  if (st.peers) record_loss(st, d.step, d.value); // the group's mean
  if (st.phase == coord_phase::stopping) {
    if (st.alive.empty()) finish(self);
    return;
  }
  if (st.phase != coord_phase::running) return;
  bool stop = d.step + 1 == plan.end_step();
  if (d.kind == 1 && !stop) {
    log_info("coordinator: stopping after step {} as asked", d.step);
    stop = true;
  }
  if (stop && d.step + 1 == plan.end_step()) {
    drain_then_stop(self);
  } else if (stop) { // stop_after: later steps' slots stay out (the feeder filled ahead)
    stop_all(self);
  } else {
    const auto S = plan.options.stages;
    for (std::uint32_t s = 0; s < S; ++s)
      if (plan.local(s)) self->send(st.args.shards[s], allow_atom::value, d.step + 1);
    // With several ranks the reducers' collectives of the next step wait for it too.
    if (st.args.setup.dp.enabled())
      for (std::uint32_t s = 0; s < S; ++s)
        if (plan.local(s)) self->send(st.args.reducers[s], allow_atom::value, d.step + 1);
    // And the stages' own collectives or waits (stage_compute::allow; a ZeRO-3 stage on
    // one rank waits for it too).
    for (std::uint32_t s = 0; s < S; ++s)
      if (plan.local(s)) self->send(st.args.stages[s], allow_atom::value, d.step + 1);
  }
}

void on_hooks_failed(coordinator_actor* self, const work_failed& f) {
  auto& st = self->state;
  st.hook_running = false;
  if (st.phase == coord_phase::running) return fail(self, {"coordinator", f.step, "step hook threw: " + f.what});
  log_error("coordinator: the step hook of step {} threw while the run was stopping: {}", f.step, f.what);
  if (st.phase == coord_phase::stopping && st.alive.empty()) finish(self);
}

// The open step a report counts for, checking it against the plan: a report outside the
// run's steps or stages, or a second one of a kind for one stage and step (also for a
// step already complete), breaks the protocol. `seen` picks that kind's flags.
expected<open_step*> accept_report(coordinator_state& st, std::vector<bool> open_step::*seen, const char* what,
                                   std::uint32_t stage, std::uint32_t step) {
  const auto& plan = *st.args.setup.plan;
  if (stage >= plan.options.stages || step < plan.first_step || step >= plan.end_step())
    return make_error(errc::protocol, "{} of stage {} for step {}, outside the run's {} stages and steps [{}, {})",
                      what, stage, step, plan.options.stages, plan.first_step, plan.end_step());
  if (step < st.completed_below)
    return make_error(errc::protocol, "second {} of stage {} for step {}", what, stage, step);
  open_step& o = open_step_of(st, step);
  if ((o.*seen)[stage]) return make_error(errc::protocol, "second {} of stage {} for step {}", what, stage, step);
  (o.*seen)[stage] = true;
  return &o;
}

// A step is complete when every stage loaded its new version and every shard
// reported its update (the two reports of a stage come from different actors,
// in either order).
void count_report(coordinator_actor* self, open_step& o, std::uint32_t step) {
  auto& st = self->state;
  st.last_progress = std::chrono::steady_clock::now();
  if (++o.reports == 2 * local_stage_count(*st.args.setup.plan) && st.phase == coord_phase::running)
    on_step_complete(self, step);
}

void on_step_report(coordinator_actor* self, const step_report& r) {
  auto& st = self->state;
  const auto& plan = *st.args.setup.plan;
  auto o = accept_report(st, &open_step::stage_seen, "step report", r.stage, r.step);
  if (!o) return fail(self, {"coordinator", r.step, o.err().message});
  st.stage_steps[r.stage] = r.step + 1;
  if (r.stage + 1 == plan.options.stages) {
    (*o)->loss = r.loss / plan.options.micro_batches;
    record_loss(st, r.step, (*o)->loss);
    (*o)->metrics = r.metrics;
  }
  count_report(self, **o, r.step);
}

void on_data_position(coordinator_actor* self, const data_position& p) {
  auto& st = self->state;
  const auto& plan = *st.args.setup.plan;
  if (p.step < plan.first_step || p.step >= plan.end_step())
    return fail(self, {"coordinator", p.step,
                       fmt::format("data position for step {}, outside the run's steps [{}, {})", p.step,
                                   plan.first_step, plan.end_step())});
  if (p.step < st.completed_below)
    return fail(self, {"coordinator", p.step, fmt::format("data position for step {}, which already completed", p.step)});
  open_step_of(st, p.step).position = p.position;
}

void on_update_report(coordinator_actor* self, const update_report& r) {
  auto& st = self->state;
  auto o = accept_report(st, &open_step::update_seen, "update report", r.stage, r.step);
  if (!o) return fail(self, {"coordinator", r.step, o.err().message});
  (*o)->shares[r.stage] = r.sum_of_squares;
  if (r.skipped) (*o)->skipped = true;
  count_report(self, **o, r.step);
}

void on_start(coordinator_actor* self) {
  auto& st = self->state;
  const auto& a = st.args;
  const auto S = static_cast<std::uint32_t>(a.stages.size());
  const auto& plan = *a.setup.plan;
  self->send(a.feeder, wire_atom::value, a.stages.front(), a.stages.back(), caf::actor_cast<caf::actor>(self));
  for (std::uint32_t s = 0; s < S; ++s) {
    if (!plan.local(s)) continue; // stages, their shards and reducers of another process: wired there
    caf::actor up = s == 0 ? a.feeder : a.stages[s - 1];
    caf::actor down = s + 1 < S ? a.stages[s + 1] : caf::actor{};
    self->send(a.stages[s], wire_atom::value, up, down, a.feeder, a.shards[s], a.reducers[s],
               caf::actor_cast<caf::actor>(self));
    self->send(a.shards[s], wire_atom::value, a.stages[s], a.reducers[s], caf::actor_cast<caf::actor>(self));
    self->send(a.reducers[s], wire_atom::value, a.stages[s], a.shards[s]);
    for (std::uint32_t r = 0; r < S; ++r) self->send(a.reducers[s], wire_atom::value, r, a.reducers[r]);
  }
  auto watch = [&](const caf::actor& x, std::uint32_t id) {
    self->monitor(x);
    st.ids[x.address()] = id;
    st.alive.push_back(x);
  };
  watch(a.feeder, pipeline_plan::feeder_id);
  for (std::uint32_t s = 0; s < S; ++s) {
    if (!plan.local(s)) continue;
    watch(a.stages[s], plan.stage_id(s));
    watch(a.shards[s], plan.shard_id(s));
    watch(a.reducers[s], plan.reducer_id(s));
  }
  st.stage_steps.assign(S, plan.first_step);
  st.completed_below = plan.first_step;
  if (plan.options.keep_losses) st.args.summary->losses.assign(plan.options.steps, 0.0);
  st.last_progress = std::chrono::steady_clock::now();
  st.last_step_done = st.last_progress;
  // The hooks agree over the data-parallel group, or with stages across processes over the whole job.
  if (a.setup.world)
    st.peers = std::make_shared<net::communicator>(*a.setup.world, net::collective_options{}, hook_channel);
  else if (a.setup.dp.enabled())
    st.peers = std::make_shared<net::communicator>(*a.setup.dp.transport, net::collective_options{}, hook_channel);
  set_phase(self, coord_phase::running);
  if (a.wired) a.wired();
  self->send(a.feeder, go_atom::value);
  self->delayed_send(self, std::chrono::milliseconds(100), tick_atom::value);
}

void on_tick(coordinator_actor* self) {
  auto& st = self->state;
  if (st.phase != coord_phase::running) return;
  // Another process of the job was lost or failed (the rendezvous or a peer aborted the
  // transport): an actor here may wait for it forever, so stop now, naming why.
  if (auto* t = st.args.setup.job())
    if (auto why = t->aborted()) return fail(self, {"coordinator", oldest_step(st), why->message});
  const auto idle = std::chrono::steady_clock::now() - st.last_progress;
  // A running hook is progress: the updates wait for it, not for a stuck actor. With
  // several ranks that includes waiting for the others' hooks (rank 0 writing a
  // checkpoint); a rank that stops answering leaves the others waiting in a gradient
  // sum instead, outside the hooks, where the watchdog sees it (and between processes
  // the rendezvous' heartbeats do).
  if (idle > st.args.watchdog && !st.hook_running) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(idle).count();
    fail(self, {"coordinator", oldest_step(st), "watchdog: no step completed for " + std::to_string(ms) + " ms"});
    return;
  }
  self->delayed_send(self, std::chrono::milliseconds(100), tick_atom::value);
}

caf::behavior coordinator_behavior(coordinator_actor* self, coordinator_args args) {
  self->state.args = std::move(args);
  self->set_down_handler([=](caf::down_msg& dm) { on_down(self, dm); });
  return {
      [=](start_atom) {
        self->state.promise = self->make_response_promise();
        on_start(self);
        return self->state.promise;
      },
      [=](const step_report& r) { on_step_report(self, r); },
      [=](const update_report& r) { on_update_report(self, r); },
      [=](const data_position& p) { on_data_position(self, p); },
      [=](tick_atom) { on_tick(self); },
      [=](const work_done& d) { on_hooks_done(self, d); },
      [=](const work_failed& f) { on_hooks_failed(self, f); },
  };
}

} // namespace

caf::actor spawn_coordinator(caf::actor_system& sys, coordinator_args args) {
  return sys.spawn(coordinator_behavior, std::move(args));
}

} // namespace dsa::actors
