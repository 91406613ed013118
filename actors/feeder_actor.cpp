// The feeder actor; see feeder_actor.hpp.
#include "actors/feeder_actor.hpp"

#include "actors/endpoint.hpp"
#include "actors/protocol/protocol.hpp"
#include "actors/worker_job.hpp"

#include <caf/all.hpp>

#include <algorithm>

namespace dsa::actors {

namespace {

struct feeder_core {
  feeder_core(const actor_setup& setup, batch_source* src)
      : plan(*setup.plan), slots(setup.slots), source(src),
        io(setup.slots, setup.trace, pipeline_plan::feeder_id, -1),
        total(plan.options.steps * plan.options.micro_batches) {
    for (std::uint32_t i = 0; i < plan.options.feed_slots; ++i) free_slots.push_back(plan.options.feed_slots - 1 - i);
  }

  const pipeline_plan& plan;
  std::shared_ptr<slot_table> slots;
  batch_source* source;
  endpoint io;
  caf::actor first, last;
  // A slot index is free when both its input and its labels slot came back.
  std::vector<std::uint32_t> free_slots; // lowest at the back
  struct half_returned {
    std::uint32_t slot;
    bool input; // the input came back (else the labels)
  };
  std::vector<half_returned> half_free; // one of the two came back
  std::uint32_t total, next = 0; // micro-batches of the run, and the next to fill (counted from first_step)
  bool started = false, filling = false;
  std::uint32_t filling_slot = 0;
  compute_worker worker; // last: joined first
};

struct feeder_state {
  std::shared_ptr<const pipeline_plan> plan;
  std::unique_ptr<feeder_core> core;
};
using feeder_actor = caf::stateful_actor<feeder_state>;

void try_fill(feeder_actor* self) {
  auto& c = *self->state.core;
  if (!c.started || c.filling || c.free_slots.empty() || c.next >= c.total) return;
  c.filling = true;
  c.filling_slot = c.free_slots.back();
  c.free_slots.pop_back();
  const std::uint32_t step = c.plan.first_step + c.next / c.plan.options.micro_batches;
  const std::uint32_t mb = c.next % c.plan.options.micro_batches;
  auto slots = c.slots;
  auto* source = c.source;
  const slot_ref input{c.plan.input_edge, c.filling_slot}, labels{c.plan.labels_edge, c.filling_slot};
  post_job(self, c.worker, step, [=] {
    source->fill(step, mb, slots->at(input)[0], slots->at(labels)[0]);
    return work_done{0, step, mb, 0.0};
  });
}

void on_filled(feeder_actor* self, const work_done& d) {
  auto& c = *self->state.core;
  c.filling = false;
  ++c.next;
  const std::uint32_t last_id = c.plan.stage_id(c.plan.options.stages - 1);
  c.io.send_produced(self, c.first, c.plan.stage_id(0), {c.plan.input_edge, c.filling_slot}, d.step, d.micro_batch);
  c.io.send_produced(self, c.last, last_id, {c.plan.labels_edge, c.filling_slot}, d.step, d.micro_batch);
  try_fill(self);
}

status accept_released(feeder_core& c, const released& m) {
  const bool input = m.ref.edge == c.plan.input_edge;
  if (!input && m.ref.edge != c.plan.labels_edge)
    return make_error(errc::protocol, "released on edge {}, which the feeder does not write", m.ref.edge);
  DSA_TRY(c.io.received(m, input ? c.plan.stage_id(0) : c.plan.stage_id(c.plan.options.stages - 1)));
  if (std::find(c.free_slots.begin(), c.free_slots.end(), m.ref.slot) != c.free_slots.end() ||
      (c.filling && c.filling_slot == m.ref.slot))
    return make_error(errc::protocol, "{} slot {} released while not in use", input ? "input" : "labels",
                      m.ref.slot);
  auto half = std::find_if(c.half_free.begin(), c.half_free.end(), [&](const auto& h) { return h.slot == m.ref.slot; });
  if (half == c.half_free.end()) {
    c.half_free.push_back({m.ref.slot, input});
    return {};
  }
  if (half->input == input)
    return make_error(errc::protocol, "{} slot {} released twice", input ? "input" : "labels", m.ref.slot);
  c.half_free.erase(half);
  c.free_slots.push_back(m.ref.slot);
  std::sort(c.free_slots.begin(), c.free_slots.end(), std::greater<std::uint32_t>());
  return {};
}

void on_released(feeder_actor* self, const released& m) {
  auto& c = *self->state.core;
  if (auto st = accept_released(c, m); !st) {
    const std::uint32_t step = c.plan.first_step + c.next / c.plan.options.micro_batches;
    self->quit(protocol_failure("feeder", step, st.err()));
    return;
  }
  try_fill(self);
}

caf::behavior feeder_behavior(feeder_actor* self, actor_setup setup, batch_source* source) {
  self->state.plan = setup.plan;
  self->state.core = std::make_unique<feeder_core>(setup, source);
  return {
      [=](wire_atom, const caf::actor& first, const caf::actor& last) {
        self->state.core->first = first;
        self->state.core->last = last;
      },
      [=](go_atom) {
        self->state.core->started = true;
        try_fill(self);
      },
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
