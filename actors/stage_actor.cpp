// The stage actor; see stage_actor.hpp.
#include "actors/stage_actor.hpp"

#include "actors/endpoint.hpp"
#include "actors/protocol/protocol.hpp"
#include "actors/stage_runner.hpp"
#include "actors/stage_scheduler.hpp"
#include "actors/worker_job.hpp"

#include <caf/all.hpp>

#include <optional>

namespace dsa::actors {

namespace {

struct stage_core {
  stage_core(const actor_setup& setup, std::uint32_t i, stage_compute* compute)
      : plan(*setup.plan), index(i), id(plan.stage_id(i)), edges(stage_edges_of(plan, i)),
        sched({i, plan.options.stages, plan.options.micro_batches, plan.options.steps, plan.first_step},
              schedule_policy::make(plan.options.schedule, plan.options.stages, i, plan.options.micro_batches,
                                    plan.options.max_stashed, plan.options.max_deferred_w),
              {plan.options.activation_slots, plan.options.gradient_slots, plan.grads_slots(i)}),
        io(setup.slots, setup.trace, id, static_cast<std::int32_t>(i)),
        runner(std::make_shared<stage_runner>(setup.slots, edges, compute, setup.trace, id, i, plan.buckets_of(i),
                                              setup.dp.overlap || plan.streams(i))),
        compute(compute) {}

  // The compute may be waiting for an allow that will not come: it throws, so the worker
  // (destroyed next) can be joined.
  ~stage_core() { compute->cancel(); }

  std::uint32_t upstream_id() const { return index == 0 ? pipeline_plan::feeder_id : plan.stage_id(index - 1); }
  std::uint32_t downstream_id() const { return plan.stage_id(index + 1); }

  const pipeline_plan& plan;
  std::uint32_t index, id;
  stage_edges edges;
  stage_scheduler sched;
  endpoint io;
  std::shared_ptr<stage_runner> runner;
  std::optional<stage_work> running;
  stage_compute* compute;
  caf::actor upstream, downstream, feeder, shard, reducer, coordinator;
  double step_loss = 0;
  std::vector<double> step_metrics; // element-wise sum of the step's forward metrics (last stage)
  compute_worker worker{openmp_threads::keep}; // last: joined first when the core is destroyed
};

struct stage_state {
  std::shared_ptr<const pipeline_plan> plan; // keeps core->plan alive
  std::unique_ptr<stage_core> core;
};
using stage_actor = caf::stateful_actor<stage_state>;

void try_run(stage_actor* self) {
  auto& c = *self->state.core;
  auto work = c.sched.pick();
  if (!work) return;
  c.running = *work;
  auto runner = c.runner;
  post_job(self, c.worker, work->step, [runner, w = *work] { return runner->run(w); });
}

void fail_protocol(stage_actor* self, std::uint32_t step, const error& why) {
  auto& c = *self->state.core;
  self->quit(protocol_failure(c.plan.actor_name(c.id), step, why));
}

status accept_produced(stage_core& c, const produced& m) {
  const auto e = m.ref.edge;
  if (e == c.edges.input) {
    DSA_TRY(c.io.received(m, c.upstream_id()));
    return c.sched.on_input(m.step, m.micro_batch, m.ref.slot);
  }
  if (e == c.edges.labels) {
    DSA_TRY(c.io.received(m, pipeline_plan::feeder_id));
    return c.sched.on_labels(m.step, m.micro_batch, m.ref.slot);
  }
  if (e == c.edges.grad_in) {
    DSA_TRY(c.io.received(m, c.downstream_id()));
    return c.sched.on_grad(m.step, m.micro_batch, m.ref.slot);
  }
  if (e == c.edges.params) {
    DSA_TRY(c.io.received(m, c.plan.shard_id(c.index)));
    return c.sched.on_version(m.step, m.ref.slot);
  }
  return make_error(errc::protocol, "produced on edge {}, which stage {} does not read", e, c.index);
}

status accept_released(stage_core& c, const released& m) {
  const auto e = m.ref.edge;
  if (e == c.edges.output) {
    DSA_TRY(c.io.received(m, c.downstream_id()));
    return c.sched.on_out_released(m.ref.slot);
  }
  if (e == c.edges.grad_out) {
    DSA_TRY(c.io.received(m, c.upstream_id()));
    return c.sched.on_grad_out_released(m.ref.slot);
  }
  if (e == c.edges.grads) {
    DSA_TRY(c.io.received(m, c.plan.reducer_id(c.index)));
    return c.sched.on_grads_released();
  }
  return make_error(errc::protocol, "released on edge {}, which stage {} does not write", e, c.index);
}

void on_produced(stage_actor* self, const produced& m) {
  if (auto st = accept_produced(*self->state.core, m); !st) return fail_protocol(self, m.step, st.err());
  try_run(self);
}

void on_released(stage_actor* self, const released& m) {
  auto& c = *self->state.core;
  if (auto st = accept_released(c, m); !st) return fail_protocol(self, c.sched.held_version(), st.err());
  try_run(self);
}

void after_forward(stage_actor* self, const stage_work& w, const work_done& d) {
  auto& c = *self->state.core;
  c.io.send_released(self, c.upstream, c.upstream_id(), {c.edges.input, w.in_slot});
  if (c.sched.position().last()) {
    c.step_loss += d.value;
    if (c.step_metrics.size() < d.metrics.size()) c.step_metrics.resize(d.metrics.size(), 0.0);
    for (std::size_t i = 0; i < d.metrics.size(); ++i) c.step_metrics[i] += d.metrics[i];
    c.io.send_released(self, c.feeder, pipeline_plan::feeder_id, {c.edges.labels, w.labels_slot});
  } else {
    c.io.send_produced(self, c.downstream, c.downstream_id(), {c.edges.output, w.out_slot}, w.step, w.micro_batch);
  }
}

void after_backward(stage_actor* self, const stage_work& w) {
  auto& c = *self->state.core;
  if (!c.sched.position().last())
    c.io.send_released(self, c.downstream, c.downstream_id(), {c.edges.grad_in, w.in_slot});
  if (!c.sched.position().first())
    c.io.send_produced(self, c.upstream, c.upstream_id(), {c.edges.grad_out, w.out_slot}, w.step, w.micro_batch);
}

// A gradient bucket is in its slot (the worker said so): the reducer may read it.
void on_grads_ready(stage_actor* self, const grads_ready& g) {
  auto& c = *self->state.core;
  DSA_CHECK(c.running && (c.running->kind == work_kind::backward || c.running->kind == work_kind::weight) &&
                c.running->last_of_step && c.running->step == g.step &&
                g.bucket < c.plan.grads_slots(c.index),
            "stage {}: gradient bucket {} of step {} outside the step's last backward", c.index, g.bucket, g.step);
  c.io.send_produced(self, c.reducer, c.plan.reducer_id(c.index), {c.edges.grads, g.bucket}, g.step,
                     c.running->micro_batch);
}

void after_load(stage_actor* self, const stage_work& w) {
  auto& c = *self->state.core;
  c.io.send_released(self, c.shard, c.plan.shard_id(c.index), {c.edges.params, w.in_slot});
  self->send(c.coordinator, step_report{c.index, w.step - 1, c.step_loss, std::move(c.step_metrics)});
  c.step_loss = 0;
  c.step_metrics.clear();
}

void on_done(stage_actor* self, const work_done& d) {
  auto& c = *self->state.core;
  DSA_CHECK(c.running && static_cast<std::uint32_t>(c.running->kind) == d.kind && c.running->step == d.step,
            "stage {}: work_done for work it did not start", c.index);
  const stage_work w = *c.running;
  c.running.reset();
  c.sched.on_done(w);
  switch (w.kind) {
    case work_kind::forward: after_forward(self, w, d); break;
    case work_kind::backward: after_backward(self, w); break;
    case work_kind::load: after_load(self, w); break;
    case work_kind::weight: break; // B already sent the input gradient; the buckets went out as they filled
  }
  try_run(self);
}

caf::behavior stage_behavior(stage_actor* self, actor_setup setup, std::uint32_t index, stage_compute* compute) {
  self->state.plan = setup.plan;
  self->state.core = std::make_unique<stage_core>(setup, index, compute);
  compute->allow(setup.plan->first_step);
  // The worker announces each published gradient bucket to this actor by message.
  caf::weak_actor_ptr weak{self->ctrl()};
  self->state.core->runner->set_sender([weak](std::uint32_t step, std::uint32_t bucket) {
    if (auto strong = weak.lock()) caf::anon_send(caf::actor_cast<caf::actor>(strong), grads_ready{step, bucket});
  });
  return {
      [=](wire_atom, const caf::actor& upstream, const caf::actor& downstream, const caf::actor& feeder,
          const caf::actor& shard, const caf::actor& reducer, const caf::actor& coordinator) {
        auto& c = *self->state.core;
        c.upstream = upstream;
        c.downstream = downstream;
        c.feeder = feeder;
        c.shard = shard;
        c.reducer = reducer;
        c.coordinator = coordinator;
      },
      [=](const produced& m) { on_produced(self, m); },
      [=](drain_atom) -> caf::result<done_atom> { return self->state.core->io.drain(self); },
      [=](const released& m) { on_released(self, m); },
      [=](const work_done& d) { on_done(self, d); },
      [=](const grads_ready& g) { on_grads_ready(self, g); },
      [=](allow_atom, std::uint32_t step) { self->state.core->compute->allow(step); },
      [=](const work_failed& f) {
        auto& c = *self->state.core;
        self->quit(make_failure(runtime_errc::compute_failed, {c.plan.actor_name(c.id), f.step, f.what}));
      },
  };
}

} // namespace

caf::actor spawn_stage(caf::actor_system& sys, const actor_setup& setup, std::uint32_t index,
                       stage_compute* compute) {
  const schedule_policy policy =
      schedule_policy::make(setup.plan->options.schedule, setup.plan->options.stages, index,
                            setup.plan->options.micro_batches, setup.plan->options.max_stashed,
                            setup.plan->options.max_deferred_w);
  compute->reserve_stash(policy.stash_slots);
  if (policy.split_backward) compute->split_backward();
  return sys.spawn(stage_behavior, setup, index, compute);
}

} // namespace dsa::actors
