// The optimizer shard actor; see optimizer_actor.hpp.
#include "actors/optimizer_actor.hpp"

#include "actors/endpoint.hpp"
#include "actors/protocol/protocol.hpp"
#include "actors/worker_job.hpp"

#include <caf/all.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <optional>

namespace dsa::actors {

namespace {

struct shard_core {
  shard_core(const actor_setup& setup, std::uint32_t i, optimizer_compute* opt, update_release release)
      : plan(*setup.plan), slots(setup.slots), trace(setup.trace), index(i), id(plan.shard_id(i)),
        reduced_edge(plan.reduced_edges[i]), params_edge(plan.params_edges[i]), optimizer(opt),
        io(setup.slots, setup.trace, id, static_cast<std::int32_t>(i)),
        allowed(release == update_release::immediately ? std::numeric_limits<std::uint32_t>::max()
                                                       : plan.first_step),
        streams(plan.streams(i)) {}
  // A stream_update waiting for parts that will not come (the run stops) must end before
  // the worker is joined.
  ~shard_core() {
    if (streams) optimizer->cancel();
  }

  const pipeline_plan& plan;
  std::shared_ptr<slot_table> slots;
  trace_recorder* trace;
  std::uint32_t index, id, reduced_edge, params_edge;
  optimizer_compute* optimizer;
  endpoint io;
  caf::actor stage, reducer, coordinator;
  bool params_slot_free = true;
  std::uint32_t allowed;               // updates of steps <= allowed may start
  std::optional<reduced> waiting; // reduced gradients whose update has not started
  // Speculation: the step whose reduced_early came and whose speculative job has not
  // started, and the step whose speculative job was posted (its update follows it on
  // the same worker, holding the params slot meanwhile).
  std::optional<std::uint32_t> early, speculated;
  // A streamed update (plan.streams): the step whose first reduced_part came and whose
  // stream job has not started, the step whose stream job was posted (its update follows
  // on the same worker), and the first parameter of the last part (parts come in order).
  bool streams = false;
  std::optional<std::uint32_t> stream_pending, streaming;
  std::uint32_t part_first = 0;
  std::uint32_t next_step = plan.first_step; // the step whose gradients come next
  compute_worker worker; // last: joined first
};

struct shard_state {
  std::shared_ptr<const pipeline_plan> plan;
  std::unique_ptr<shard_core> core;
};
using shard_actor = caf::stateful_actor<shard_state>;

// work_done.kind of an update: 1 when applied, 0 when skipped; work_done.value: the stage's share.
// A speculative job's: speculated_job (whether it speculated is the optimizer's to count).
constexpr std::uint32_t speculated_job = 2;
constexpr std::uint32_t streamed_job = 3;

// A job that starts the update of `step` before its `reduced` (the update follows on the
// same worker): a speculation (speculated_job) or a stream (streamed_job), as a span.
void start_early_job(shard_actor* self, std::uint32_t step, std::uint32_t kind) {
  auto& c = *self->state.core;
  auto* trace = c.trace;
  auto* optimizer = c.optimizer;
  const std::uint32_t id = c.id, index = c.index;
  post_job(self, c.worker, step, [=] {
    const bool stream = kind == streamed_job;
    trace_span span(trace, stream ? trace_name::stream_update : trace_name::speculate, id,
                    static_cast<std::int32_t>(index), step, 0);
    if (!(stream ? optimizer->stream_update(step) : optimizer->speculate(step))) span.cancel();
    return work_done{kind, step, 0, 0.0, {}, {}};
  });
}

void start_update(shard_actor* self, const reduced& r) {
  auto& c = *self->state.core;
  auto slots = c.slots;
  auto* trace = c.trace;
  auto* optimizer = c.optimizer;
  const std::uint32_t id = c.id, index = c.index, params = c.params_edge, step = r.data.step;
  const bool last = step + 1 == c.plan.end_step();
  const grad_totals totals{r.sum_of_squares, r.own_sum_of_squares, r.global};
  post_job(self, c.worker, step, [=] {
    bool applied = false;
    {
      trace_span span(trace, trace_name::optimizer, id, static_cast<std::int32_t>(index), step, 0);
      applied = optimizer->update(step, totals, slots->at({params, 0}));
    }
    // The shard's own spans still unrecorded (the last writes of an NVMe swap) must reach
    // the trace file, which the coordinator closes once every actor has ended.
    if (last) optimizer->trace_detach();
    return work_done{applied ? 1u : 0u, step, 0, totals.own_sum_of_squares, {}, {}};
  });
}

// Starts the waiting update once the stage has read the previous version (its
// released and the reducer's reduced come from different actors, in either order)
// and the coordinator allowed the step.
// With speculation the early step starts under the same conditions first (reduced_early
// always precedes its reduced: one sender), and its update then needs nothing more.
void try_start(shard_actor* self) {
  auto& c = *self->state.core;
  if (c.early && c.params_slot_free && *c.early <= c.allowed) {
    c.speculated = c.early;
    c.early.reset();
    c.params_slot_free = false;
    start_early_job(self, *c.speculated, speculated_job);
  }
  if (c.stream_pending && c.params_slot_free && *c.stream_pending <= c.allowed) {
    c.streaming = c.stream_pending;
    c.stream_pending.reset();
    c.params_slot_free = false;
    start_early_job(self, *c.streaming, streamed_job);
  }
  if (!c.waiting) return;
  const bool held = (c.speculated && *c.speculated == c.waiting->data.step) ||
                    (c.streaming && *c.streaming == c.waiting->data.step);
  if (!held && (c.early || c.stream_pending || !c.params_slot_free || c.waiting->data.step > c.allowed)) return;
  const reduced ready = *c.waiting;
  c.waiting.reset();
  c.speculated.reset();
  c.streaming.reset();
  c.params_slot_free = false;
  start_update(self, ready);
}

status accept_early(shard_core& c, const reduced_early& e) {
  if (c.early || c.speculated || c.waiting || e.step != c.next_step || e.step >= c.plan.end_step())
    return make_error(errc::protocol, "early gradients of step {} arrived, expected step {} (run ends before {})",
                      e.step, c.next_step, c.plan.end_step());
  c.early = e.step;
  return {};
}

// A part of a streamed step: handed to the optimizer at once (its stream job may be
// waiting for it); the first of a step makes the stream job pending.
status accept_part(shard_core& c, const reduced_part& p) {
  const bool started = (c.stream_pending && *c.stream_pending == p.step) || (c.streaming && *c.streaming == p.step);
  if (!c.streams || c.waiting || p.step != c.next_step || p.step >= c.plan.end_step() ||
      (started && p.first >= c.part_first))
    return make_error(errc::protocol, "gradient part of step {} from parameter {} arrived, expected {} of step {}{}",
                      p.step, p.first, c.streams ? "parts" : "no parts", c.next_step,
                      started ? fmt::format(" before parameter {}", c.part_first) : std::string());
  c.part_first = p.first;
  c.optimizer->gradients_final(p.step, p.first);
  if (!started) c.stream_pending = p.step;
  return {};
}

status accept_reduced(shard_core& c, const reduced& r) {
  if (r.data.ref.edge != c.reduced_edge)
    return make_error(errc::protocol, "reduced gradients on edge {}, expected edge {} ({})", r.data.ref.edge,
                      c.reduced_edge, c.slots->edge_name(c.reduced_edge));
  DSA_TRY(c.io.received(r.data, c.plan.reducer_id(c.index)));
  const bool streamed_step = (c.stream_pending && *c.stream_pending == r.data.step) ||
                             (c.streaming && *c.streaming == r.data.step);
  if (streamed_step && c.part_first != 0)
    return make_error(errc::protocol, "gradients of step {} arrived before its part from parameter 0 (the last came "
                      "from parameter {})", r.data.step, c.part_first);
  if (c.streams && !streamed_step)
    return make_error(errc::protocol, "gradients of step {} arrived without its parts", r.data.step);
  if (c.waiting || r.data.step != c.next_step || r.data.step >= c.plan.end_step())
    return make_error(errc::protocol, "gradients of step {} arrived, expected step {} (run ends before {}{})",
                      r.data.step, c.next_step, c.plan.end_step(), c.waiting ? "; the last are still waiting" : "");
  ++c.next_step;
  c.waiting = r;
  return {};
}

status accept_released(shard_core& c, const released& m) {
  if (m.ref.edge != c.params_edge)
    return make_error(errc::protocol, "released on edge {}, which the shard does not write", m.ref.edge);
  DSA_TRY(c.io.received(m, c.plan.stage_id(c.index)));
  if (c.params_slot_free) return make_error(errc::protocol, "parameter slot released twice");
  c.params_slot_free = true;
  return {};
}

void fail_protocol(shard_actor* self, std::uint32_t step, const error& why) {
  auto& c = *self->state.core;
  self->quit(protocol_failure(c.plan.actor_name(c.id), step, why));
}

void on_reduced(shard_actor* self, const reduced& r) {
  if (auto st = accept_reduced(*self->state.core, r); !st) return fail_protocol(self, r.data.step, st.err());
  try_start(self);
}

void on_allow(shard_actor* self, std::uint32_t step) {
  auto& c = *self->state.core;
  c.allowed = std::max(c.allowed, step);
  try_start(self);
}

void on_updated(shard_actor* self, const work_done& d) {
  auto& c = *self->state.core;
  if (d.kind == speculated_job || d.kind == streamed_job) return; // the update of the step follows on the worker
  const auto stage_id = c.plan.stage_id(c.index);
  c.io.send_released(self, c.reducer, c.plan.reducer_id(c.index), {c.reduced_edge, 0});
  c.io.send_produced(self, c.stage, stage_id, {c.params_edge, 0}, d.step + 1, 0);
  self->send(c.coordinator, update_report{c.index, d.step, d.value, d.kind == 0});
}

caf::behavior shard_behavior(shard_actor* self, actor_setup setup, std::uint32_t index,
                             optimizer_compute* optimizer, update_release release) {
  self->state.plan = setup.plan;
  self->state.core = std::make_unique<shard_core>(setup, index, optimizer, release);
  return {
      [=](wire_atom, const caf::actor& stage, const caf::actor& reducer, const caf::actor& coordinator) {
        self->state.core->stage = stage;
        self->state.core->reducer = reducer;
        self->state.core->coordinator = coordinator;
      },
      [=](const reduced& r) { on_reduced(self, r); },
      [=](const reduced_early& e) {
        if (auto st = accept_early(*self->state.core, e); !st) return fail_protocol(self, e.step, st.err());
        try_start(self);
      },
      [=](const reduced_part& p) {
        auto& c = *self->state.core;
        if (self->current_sender() != c.reducer)
          return fail_protocol(self, p.step, make_error(errc::protocol, "a gradient part from an actor other than "
                                                                        "the stage's reducer"));
        if (auto st = accept_part(c, p); !st) return fail_protocol(self, p.step, st.err());
        try_start(self);
      },
      [=](allow_atom, std::uint32_t step) { on_allow(self, step); },
      [=](drain_atom) -> caf::result<done_atom> { return self->state.core->io.drain(self); },
      [=](const released& m) {
        auto& c = *self->state.core;
        if (auto st = accept_released(c, m); !st) return fail_protocol(self, c.next_step, st.err());
        try_start(self);
      },
      [=](const work_done& d) { on_updated(self, d); },
      [=](const work_failed& f) {
        auto& c = *self->state.core;
        self->quit(make_failure(runtime_errc::compute_failed, {c.plan.actor_name(c.id), f.step, f.what}));
      },
  };
}

} // namespace

caf::actor spawn_optimizer(caf::actor_system& sys, const actor_setup& setup, std::uint32_t index,
                           optimizer_compute* optimizer, update_release release) {
  return sys.spawn(shard_behavior, setup, index, optimizer, release);
}

} // namespace dsa::actors
