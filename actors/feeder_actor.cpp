// The feeder actor; see feeder_actor.hpp.
#include "actors/feeder_actor.hpp"

#include "actors/endpoint.hpp"
#include "actors/feed_state.hpp"
#include "actors/protocol/protocol.hpp"
#include "actors/worker_job.hpp"

#include <caf/all.hpp>

namespace dsa::actors {

namespace {

struct feeder_core {
  feeder_core(const actor_setup& setup, batch_source* src)
      : plan(*setup.plan), slots(setup.slots), source(src), io(setup.slots, setup.trace, pipeline_plan::feeder_id, -1),
        feed(plan.feed_slots, plan.options.micro_batches, plan.options.steps, plan.first_step) {}

  const pipeline_plan& plan;
  std::shared_ptr<slot_table> slots;
  batch_source* source;
  endpoint io;
  caf::actor first, last, coordinator;
  feed_state feed;
  bool started = false;
  compute_worker worker; // last: joined first
};

struct feeder_state {
  std::shared_ptr<const pipeline_plan> plan;
  std::unique_ptr<feeder_core> core;
};
using feeder_actor = caf::stateful_actor<feeder_state>;

void try_fill(feeder_actor* self) {
  auto& c = *self->state.core;
  if (!c.started) return;
  const auto fill = c.feed.start_fill();
  if (!fill) return;
  const std::uint32_t step = fill->step, mb = fill->micro_batch;
  auto slots = c.slots;
  auto* source = c.source;
  const slot_ref input{c.plan.input_edge, fill->slot}, labels{c.plan.labels_edge, fill->slot};
  const bool last_of_step = mb + 1 == c.plan.options.micro_batches;
  post_job(self, c.worker, step, [=] {
    source->fill(step, mb, slots->at(input)[0], slots->at(labels)[0]);
    return work_done{0, step, mb, 0.0, {}, last_of_step ? source->position() : std::vector<std::uint64_t>{}};
  });
}

void on_filled(feeder_actor* self, const work_done& d) {
  auto& c = *self->state.core;
  const feed_fill fill = c.feed.on_filled();
  const std::uint32_t last_id = c.plan.stage_id(c.plan.options.stages - 1);
  // Before the micro-batch goes out, so the position reaches the coordinator before the step can complete.
  if (d.micro_batch + 1 == c.plan.options.micro_batches)
    self->send(c.coordinator, data_position{d.step, d.position});
  // With stages across processes a feeder feeds only the edges of its process's
  // stages (each process reads the same batches); the other edge's slot is free at once.
  if (c.plan.local(0))
    c.io.send_produced(self, c.first, c.plan.stage_id(0), {c.plan.input_edge, fill.slot}, d.step, d.micro_batch);
  else if (auto st = c.feed.on_released(feed_edge::input, fill.slot); !st)
    return self->quit(protocol_failure("feeder", d.step, st.err()));
  if (c.plan.local(c.plan.options.stages - 1))
    c.io.send_produced(self, c.last, last_id, {c.plan.labels_edge, fill.slot}, d.step, d.micro_batch);
  else if (auto st = c.feed.on_released(feed_edge::labels, fill.slot); !st)
    return self->quit(protocol_failure("feeder", d.step, st.err()));
  try_fill(self);
}

status accept_released(feeder_core& c, const released& m) {
  const bool input = m.ref.edge == c.plan.input_edge;
  if (!input && m.ref.edge != c.plan.labels_edge)
    return make_error(errc::protocol, "released on edge {}, which the feeder does not write", m.ref.edge);
  DSA_TRY(c.io.received(m, input ? c.plan.stage_id(0) : c.plan.stage_id(c.plan.options.stages - 1)));
  return c.feed.on_released(input ? feed_edge::input : feed_edge::labels, m.ref.slot);
}

void on_released(feeder_actor* self, const released& m) {
  auto& c = *self->state.core;
  if (auto st = accept_released(c, m); !st) {
    self->quit(protocol_failure("feeder", c.feed.next_step(), st.err()));
    return;
  }
  try_fill(self);
}

caf::behavior feeder_behavior(feeder_actor* self, actor_setup setup, batch_source* source) {
  self->state.plan = setup.plan;
  self->state.core = std::make_unique<feeder_core>(setup, source);
  return {
      [=](wire_atom, const caf::actor& first, const caf::actor& last, const caf::actor& coordinator) {
        self->state.core->first = first;
        self->state.core->last = last;
        self->state.core->coordinator = coordinator;
      },
      [=](go_atom) {
        // A process running neither end of the pipeline feeds nothing.
        const auto& plan = *self->state.plan;
        self->state.core->started = plan.local(0) || plan.local(plan.options.stages - 1);
        try_fill(self);
      },
      [=](drain_atom) -> caf::result<done_atom> { return self->state.core->io.drain(self); },
      [=](const released& m) { on_released(self, m); },
      [=](const work_done& d) { on_filled(self, d); },
      [=](const work_failed& f) {
        self->quit(make_failure(runtime_errc::compute_failed, {"feeder", f.step, f.what}));
      },
  };
}

} // namespace

caf::actor spawn_feeder(caf::actor_system& sys, const actor_setup& setup, batch_source* source) {
  return sys.spawn(feeder_behavior, setup, source);
}

} // namespace dsa::actors
