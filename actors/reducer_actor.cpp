// The reducer actor; see reducer_actor.hpp.
#include "actors/reducer_actor.hpp"

#include "actors/data_parallel.hpp"
#include "actors/endpoint.hpp"
#include "actors/gradient_gather.hpp"
#include "actors/protocol/protocol.hpp"
#include "actors/reducer_state.hpp"
#include "actors/worker_job.hpp"
#include "optim/grad_clip.hpp"

#include <caf/all.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace dsa::actors {

namespace {

enum job_kind : std::uint32_t { gather_job = 0, tied_sum_job = 1, tied_copy_job = 2, bucket_job = 3, part_job = 4 };

tied_role role_of(const pipeline_plan& plan, std::uint32_t index) {
  if (!plan.exchanges_tied()) return tied_role::none;
  if (index == 0) return tied_role::owner;
  if (index + 1 == plan.options.stages) return tied_role::copy;
  return tied_role::none;
}

net::collective_options collectives(const data_parallel_options& dp) {
  net::collective_options o;
  o.shared_memory = dp.shared_memory;
  return o;
}

struct reducer_core {
  reducer_core(const actor_setup& setup, std::uint32_t i, int tied, std::vector<gradient_part> parts, bool summed,
               const optimizer_compute* optimizer)
      : plan(*setup.plan), slots(setup.slots), trace(setup.trace), index(i), id(plan.reducer_id(i)),
        grads_edge(plan.grads_edges[i]), reduced_edge(plan.reduced_edges[i]),
        state(i, plan.options.stages, role_of(plan, i), plan.options.totals,
              plan.options.speculative_update && !plan.streams(i)),
        tied_index(tied),
        kept(std::move(parts)), presummed(summed), shard_compute(optimizer),
        io(setup.slots, setup.trace, id, static_cast<std::int32_t>(i)),
        peers(plan.options.stages) {
    if (setup.dp.enabled())
      replicas = std::make_shared<net::host_collectives>(
          std::make_shared<net::communicator>(*setup.dp.transport, collectives(setup.dp), reducer_channel(i)),
          setup.dp.logger, plan.actor_name(id));
    bucket_elements = setup.dp.bucket_elements;
    bucket_arrived.assign(plan.grads_slots(i), false);
    streams = plan.streams(i);
    allowed = plan.first_step;
    DSA_CHECK(state.role() == tied_role::none || tied_index >= 0,
              "reducer {}: the plan exchanges a tied parameter this stage does not name", i);
  }

  std::uint32_t owner_id() const { return plan.reducer_id(0); }
  std::uint32_t copy_id() const { return plan.reducer_id(plan.options.stages - 1); }

  const pipeline_plan& plan;
  std::shared_ptr<slot_table> slots;
  trace_recorder* trace;
  std::uint32_t index, id, grads_edge, reduced_edge;
  reducer_state state;
  int tied_index;
  std::vector<gradient_part> kept; // the shard's gradient_parts(): empty when it keeps every gradient whole
  bool presummed = false;          // the stage's gradients arrive summed over the ranks, kept parts only
  const optimizer_compute* shard_compute = nullptr; // asked sums_gradients() before each bucket sum
  endpoint io;
  caf::actor stage, shard;
  std::vector<caf::actor> peers; // [s]: the reducer of stage s
  bool tied_up_free = true;      // copy: the owner has read the offered gradient
  // Data parallelism: this stage's channel to the same stage's reducers on the other
  // ranks (enqueued and waited for on the worker only; the host collectives run on a
  // thread of their own), and the bucket size of the gradient sums.
  std::shared_ptr<net::async_collectives> replicas;
  std::int64_t bucket_elements = 0;
  // The step's gradient buckets (one grads slot each): which arrived, how many
  // were summed over the ranks, the next to sum (buckets are summed in order, so
  // every rank issues the same collectives in the same order).
  std::optional<std::uint32_t> bucket_step;
  std::vector<bool> bucket_arrived;
  std::uint32_t buckets_summed = 0, next_sum = 0;
  // Collectives of steps <= allowed may start (allow_atom from the coordinator, after
  // the previous step's hooks): a step the ranks agreed not to run never starts one,
  // so no rank waits in it for ranks that stopped.
  std::uint32_t allowed = 0;
  // A streamed update (plan.streams): each bucket, once it arrived and is summed over the
  // ranks, is cast into the shard's buffers on its own (a part job) and the shard told
  // (reduced_part); buckets waiting for the shard to give the buffers back, the parts
  // done, and each gradient's sum of squares (added in parameter order at the end, as
  // the whole gather adds them).
  bool streams = false;
  std::vector<std::uint32_t> parts_waiting;
  std::uint32_t parts_done = 0;
  std::vector<double> part_sums;
  compute_worker worker;         // last: joined first
};

struct reducer_state_holder {
  std::shared_ptr<const pipeline_plan> plan;
  std::unique_ptr<reducer_core> core;
};
using reducer_actor = caf::stateful_actor<reducer_state_holder>;

void start_job(reducer_actor* self, std::uint32_t kind, std::uint32_t step) {
  auto& c = *self->state.core;
  auto slots = c.slots;
  auto* trace = c.trace;
  const std::uint32_t id = c.id, index = c.index, grads = c.grads_edge, reduced = c.reduced_edge;
  const int tied = c.tied_index;
  const int skip = c.state.role() == tied_role::none ? -1 : tied;
  const std::uint32_t buckets = c.plan.grads_slots(index);
  const std::vector<grad_bucket>* plan_buckets = &c.plan.buckets_of(index);
  const std::vector<gradient_part>* kept = &c.kept; // the core (and so this) outlives its worker's jobs
  const bool presummed = c.presummed;
  auto replicas = c.replicas;
  const slot_ref tied_in = c.state.role() == tied_role::owner ? slot_ref{c.plan.tied_up_edge, 0}
                                                              : slot_ref{c.plan.tied_down_edge, 0};
  post_job(self, c.worker, step, [=] {
    trace_span span(trace, trace_name::reduce, id, static_cast<std::int32_t>(index), step, 0);
    slot_contents& buffers = slots->at({reduced, 0});
    double share = 0;
    if (kind == gather_job) {
      // The buckets' tensors in parameter order (bucket b holds parameters [first, last)).
      slot_contents all;
      if (buckets == 1) {
        all = slots->at({grads, 0});
      } else {
        all.resize(buffers.size());
        for (std::uint32_t b = 0; b < buckets; ++b) {
          const grad_bucket& range = plan_buckets->at(b);
          const slot_contents& part = slots->at({grads, b});
          if (part.size() != range.last - range.first || range.last > all.size())
            throw std::runtime_error(fmt::format("gradient bucket {} holds {} tensors for parameters [{}, {})", b,
                                                 part.size(), range.first, range.last));
          for (std::uint32_t i = range.first; i < range.last; ++i) all[i] = part[i - range.first];
        }
      }
      share = gather(all, buffers, *kept, skip, presummed);
      if (presummed && replicas) {
        // Each rank holds its parts only: the stage's sum of squares is every rank's, added
        // in rank order (the same bits everywhere).
        auto total = sum_over_ranks(*replicas, {share});
        if (!total)
          throw std::runtime_error("adding the ranks' gradient sums of squares: " + total.err().message);
        share = total->front();
      }
    } else {
      tensor& mine = buffers.at(static_cast<std::size_t>(tied));
      const tensor& other = slots->at(tied_in).at(0);
      if (other.shape() != mine.shape() || other.type() != dtype::f32) // from another reducer: fails this one
        throw std::runtime_error(
            fmt::format("the tied gradient received, {}, does not fit this stage's {}", other.describe(),
                        mine.describe()));
      if (kind == tied_sum_job) {
        float* m = mine.data<float>();
        const float* o = other.data<float>();
        for (std::int64_t j = 0; j < mine.numel(); ++j) m[j] = m[j] + o[j]; // first stage's term first
        share = optim::sum_of_squares(mine);
      } else {
        mine.copy_from(other);
      }
    }
    return work_done{kind, step, 0, share, {}, {}};
  });
}

// Sums bucket b of the stage's gradients over the data-parallel ranks, in place in
// the stage's accumulators (the stage leaves them alone until every bucket is back).
void start_bucket_sum(reducer_actor* self, std::uint32_t step, std::uint32_t bucket) {
  auto& c = *self->state.core;
  auto slots = c.slots;
  auto* trace = c.trace;
  auto replicas = c.replicas;
  const std::uint32_t id = c.id, index = c.index, grads = c.grads_edge;
  const std::int64_t limit = c.bucket_elements;
  const optimizer_compute* shard = c.shard_compute;
  post_job(self, c.worker, step, [=] {
    // A compressed optimizer's local step: each rank keeps its own gradients.
    if (shard && !shard->sums_gradients()) return work_done{bucket_job, step, bucket, 0.0, {}, {}};
    trace_span span(trace, trace_name::allreduce, id, static_cast<std::int32_t>(index), step, bucket);
    slot_contents& tensors = slots->at({grads, bucket});
    std::uint64_t bytes = 0;
    for (const auto& t : tensors)
      if (t.defined()) bytes += t.nbytes();
    span.set_bytes(bytes);
    if (auto s = allreduce_buffers(*replicas, tensors, limit); !s)
      throw std::runtime_error(fmt::format("summing gradient bucket {} over the data-parallel ranks: {}", bucket,
                                           s.err().message));
    return work_done{bucket_job, step, bucket, 0.0, {}, {}};
  });
}

// A streamed update: bucket `bucket` of the step's gradients (summed over the ranks, if
// several) into the shard's buffers, each gradient's sum of squares into part_sums.
void start_part(reducer_actor* self, std::uint32_t step, std::uint32_t bucket) {
  auto& c = *self->state.core;
  auto slots = c.slots;
  auto* trace = c.trace;
  const std::uint32_t id = c.id, index = c.index, grads = c.grads_edge, reduced = c.reduced_edge;
  const grad_bucket range = c.plan.buckets_of(index).at(bucket);
  c.part_sums.resize(slots->at({reduced, 0}).size());
  // The core (and so these) outlives its worker's jobs; the actor reads part_sums only
  // after every part's work_done.
  const std::vector<gradient_part>* kept = &c.kept;
  std::vector<double>* sums = &c.part_sums;
  const bool presummed = c.presummed;
  post_job(self, c.worker, step, [=] {
    trace_span span(trace, trace_name::reduce, id, static_cast<std::int32_t>(index), step, bucket);
    slot_contents& buffers = slots->at({reduced, 0});
    const slot_contents& part = slots->at({grads, bucket});
    if (part.size() != range.last - range.first || range.last > buffers.size())
      throw std::runtime_error(fmt::format("gradient bucket {} holds {} tensors for parameters [{}, {})", bucket,
                                           part.size(), range.first, range.last));
    for (std::uint32_t i = range.first; i < range.last; ++i) {
      cast_gradient(i, part[i - range.first], buffers[i], *kept, presummed);
      (*sums)[i] = optim::sum_of_squares(part[i - range.first]);
    }
    return work_done{part_job, step, bucket, 0.0, {}, {}};
  });
}

// Starts the part jobs of the buckets that wait, once the shard's buffers are free.
void start_waiting_parts(reducer_actor* self) {
  auto& c = *self->state.core;
  if (!c.bucket_step || !c.state.buffers_free()) return;
  for (const std::uint32_t b : c.parts_waiting) start_part(self, *c.bucket_step, b);
  c.parts_waiting.clear();
}

void note_partial(reducer_core& c, trace_kind kind, std::uint32_t from, std::uint32_t to, std::uint32_t step) {
  if (!c.trace) return;
  trace_record r;
  r.t0_ns = c.trace->now_ns();
  r.kind = static_cast<std::uint8_t>(kind);
  r.name = static_cast<std::uint16_t>(trace_name::grad_partial);
  r.actor = c.id;
  r.stage = static_cast<std::int32_t>(c.index);
  r.peer = c.plan.reducer_id(kind == trace_kind::send ? to : from);
  r.edge = from * c.plan.options.stages + to; // not a slot edge: the pair of stages
  r.bytes = sizeof(double);
  r.flow = flow_id(trace_name::grad_partial, r.edge, step);
  r.step = step;
  c.trace->record(r);
}

template <class Event>
void handle(reducer_actor* self, std::uint32_t step, Event&& event);

void execute(reducer_actor* self, const reducer_state::actions& todo) {
  auto& c = *self->state.core;
  const auto S = c.plan.options.stages;
  for (const auto& a : todo) {
    switch (a.what) {
      case reducer_action::kind::gather:
        if (c.streams) { // every bucket is in the buffers already (part jobs)
          double share = 0;
          for (const double x : c.part_sums) share += x; // parameter order, as gather() adds them
          handle(self, a.step, [&](reducer_state& st) { return st.on_gathered(a.step, share); });
          break;
        }
        start_job(self, gather_job, a.step);
        break;
      case reducer_action::kind::tied_sum: start_job(self, tied_sum_job, a.step); break;
      case reducer_action::kind::tied_copy: start_job(self, tied_copy_job, a.step); break;
      case reducer_action::kind::send_tied_up: {
        if (!c.tied_up_free) {
          self->quit(protocol_failure(c.plan.actor_name(c.id), a.step,
                                      make_error(errc::protocol, "tied gradient of step {} offered before the first "
                                                                 "stage's reducer released the last",
                                                 a.step)));
          return;
        }
        c.tied_up_free = false;
        c.slots->at({c.plan.tied_up_edge, 0}).at(0) = c.slots->at({c.reduced_edge, 0}).at(c.tied_index);
        c.io.send_produced(self, c.peers[0], c.owner_id(), {c.plan.tied_up_edge, 0}, a.step, 0);
        break;
      }
      case reducer_action::kind::send_tied_down:
        c.slots->at({c.plan.tied_down_edge, 0}).at(0) = c.slots->at({c.reduced_edge, 0}).at(c.tied_index);
        c.io.send_produced(self, c.peers[S - 1], c.copy_id(), {c.plan.tied_down_edge, 0}, a.step, 0);
        break;
      case reducer_action::kind::publish:
        for (std::uint32_t s = 0; s < S; ++s) {
          if (s == c.index) continue;
          note_partial(c, trace_kind::send, c.index, s, a.step);
          self->send(c.peers[s], grad_partial{c.index, a.step, a.own});
        }
        break;
      case reducer_action::kind::early: self->send(c.shard, reduced_early{a.step, a.own}); break;
      case reducer_action::kind::forward: {
        produced p = c.io.stamp_produced(c.plan.shard_id(c.index), {c.reduced_edge, 0}, a.step, 0);
        self->send(c.shard, reduced{p, a.total, a.own, c.plan.options.totals == grad_scope::global});
        break;
      }
    }
  }
}

// Runs one state event and its actions; a protocol violation fails the reducer.
template <class Event>
void handle(reducer_actor* self, std::uint32_t step, Event&& event) {
  auto& c = *self->state.core;
  reducer_state::result todo = event(c.state);
  if (!todo) {
    self->quit(protocol_failure(c.plan.actor_name(c.id), step, todo.err()));
    return;
  }
  execute(self, *todo);
}

void fail_protocol(reducer_actor* self, std::uint32_t step, const error& why) {
  auto& c = *self->state.core;
  self->quit(protocol_failure(c.plan.actor_name(c.id), step, why));
}

void grads_complete(reducer_actor* self, std::uint32_t step);

// Starts the sums of the buckets that arrived, in bucket order, once their step is allowed.
// Presummed gradients need no sums: the reduction (whose sum of squares is a collective)
// starts once all arrived and the step is allowed.
void start_allowed_sums(reducer_actor* self) {
  auto& c = *self->state.core;
  if (!c.bucket_step || *c.bucket_step > c.allowed) return;
  if (c.presummed) {
    if (std::all_of(c.bucket_arrived.begin(), c.bucket_arrived.end(), [](bool a) { return a; }))
      grads_complete(self, *c.bucket_step);
    return;
  }
  while (c.next_sum < c.bucket_arrived.size() && c.bucket_arrived[c.next_sum])
    start_bucket_sum(self, *c.bucket_step, c.next_sum++);
}

// Every bucket of `step` is in (and summed over the ranks): the reduction proper starts.
void grads_complete(reducer_actor* self, std::uint32_t step) {
  auto& c = *self->state.core;
  std::fill(c.bucket_arrived.begin(), c.bucket_arrived.end(), false);
  c.bucket_step.reset();
  c.buckets_summed = c.next_sum = 0;
  handle(self, step, [&](reducer_state& st) { return st.on_grads(step); });
}

void on_produced(reducer_actor* self, const produced& m) {
  auto& c = *self->state.core;
  const bool owner = c.index == 0, copy = c.index + 1 == c.plan.options.stages;
  const bool grads = m.ref.edge == c.grads_edge;
  const bool tied = c.plan.exchanges_tied() &&
                    ((m.ref.edge == c.plan.tied_up_edge && owner) || (m.ref.edge == c.plan.tied_down_edge && copy));
  if (!grads && !tied)
    return fail_protocol(self, m.step,
                         make_error(errc::protocol, "produced on edge {}, which this reducer does not read", m.ref.edge));
  const std::uint32_t peer = grads ? c.plan.stage_id(c.index) : owner ? c.copy_id() : c.owner_id();
  if (auto st = c.io.received(m, peer); !st) return fail_protocol(self, m.step, st.err());
  if (!grads) return handle(self, m.step, [&](reducer_state& st) { return st.on_tied_arrived(m.step); });
  // A gradient bucket: once all of the step's are in (and summed over the ranks), the step's reduction starts.
  const std::uint32_t b = m.ref.slot;
  if ((c.bucket_step && *c.bucket_step != m.step) || c.bucket_arrived[b])
    return fail_protocol(self, m.step,
                         make_error(errc::protocol, "gradient bucket {} of step {} arrived {}", b, m.step,
                                    c.bucket_arrived[b] ? "twice" : "while another step's buckets are incomplete"));
  c.bucket_step = m.step;
  c.bucket_arrived[b] = true;
  if (c.replicas) return start_allowed_sums(self);
  if (c.streams) {
    c.parts_waiting.push_back(b);
    return start_waiting_parts(self);
  }
  if (std::all_of(c.bucket_arrived.begin(), c.bucket_arrived.end(), [](bool a) { return a; })) grads_complete(self, m.step);
}

void on_released(reducer_actor* self, const released& m) {
  auto& c = *self->state.core;
  const bool owner = c.index == 0, copy = c.index + 1 == c.plan.options.stages;
  const std::uint32_t step = c.state.current_step().value_or(0);
  const bool tied = c.plan.exchanges_tied();
  std::uint32_t peer = 0;
  if (m.ref.edge == c.reduced_edge) peer = c.plan.shard_id(c.index);
  else if (tied && m.ref.edge == c.plan.tied_down_edge && owner) peer = c.copy_id();
  else if (tied && m.ref.edge == c.plan.tied_up_edge && copy) peer = c.owner_id();
  else
    return fail_protocol(self, step,
                         make_error(errc::protocol, "released on edge {}, which this reducer does not write", m.ref.edge));
  if (auto st = c.io.received(m, peer); !st) return fail_protocol(self, step, st.err());
  if (m.ref.edge == c.reduced_edge) {
    handle(self, step, [](reducer_state& st) { return st.on_reduced_released(); });
    start_waiting_parts(self);
  } else if (m.ref.edge == c.plan.tied_down_edge) {
    handle(self, step, [](reducer_state& st) { return st.on_tied_down_released(); });
  } else if (c.tied_up_free) {
    fail_protocol(self, step, make_error(errc::protocol, "tied gradient slot released twice"));
  } else {
    c.tied_up_free = true;
  }
}

void on_done(reducer_actor* self, const work_done& d) {
  auto& c = *self->state.core;
  switch (d.kind) {
    case gather_job:
      for (std::uint32_t b = 0; b < c.plan.grads_slots(c.index); ++b) {
        c.slots->at({c.grads_edge, b}).clear(); // drop the views of the stage's gradients
        c.io.send_released(self, c.stage, c.plan.stage_id(c.index), {c.grads_edge, b});
      }
      handle(self, d.step, [&](reducer_state& st) { return st.on_gathered(d.step, d.value); });
      break;
    case bucket_job:
      if (c.streams) {
        c.parts_waiting.push_back(d.micro_batch);
        start_waiting_parts(self);
      } else if (++c.buckets_summed == c.bucket_arrived.size()) {
        grads_complete(self, d.step);
      }
      break;
    case part_job: {
      const std::uint32_t b = d.micro_batch;
      c.slots->at({c.grads_edge, b}).clear(); // drop the views of the stage's gradients
      c.io.send_released(self, c.stage, c.plan.stage_id(c.index), {c.grads_edge, b});
      self->send(c.shard, reduced_part{d.step, c.plan.buckets_of(c.index).at(b).first});
      if (++c.parts_done == c.bucket_arrived.size()) {
        c.parts_done = 0;
        grads_complete(self, d.step);
      }
      break;
    }
    case tied_sum_job:
      c.io.send_released(self, c.peers.back(), c.copy_id(), {c.plan.tied_up_edge, 0});
      handle(self, d.step, [&](reducer_state& st) { return st.on_tied_done(d.step, d.value); });
      break;
    default:
      c.io.send_released(self, c.peers.front(), c.owner_id(), {c.plan.tied_down_edge, 0});
      handle(self, d.step, [&](reducer_state& st) { return st.on_tied_done(d.step, 0.0); });
      break;
  }
}

caf::behavior reducer_behavior(reducer_actor* self, actor_setup setup, std::uint32_t index, int tied_index,
                              std::vector<gradient_part> kept, bool presummed, const optimizer_compute* shard) {
  self->state.plan = setup.plan;
  self->state.core = std::make_unique<reducer_core>(setup, index, tied_index, std::move(kept), presummed, shard);
  return {
      [=](wire_atom, const caf::actor& stage, const caf::actor& shard) {
        self->state.core->stage = stage;
        self->state.core->shard = shard;
      },
      [=](wire_atom, std::uint32_t s, const caf::actor& peer) { self->state.core->peers.at(s) = peer; },
      [=](allow_atom, std::uint32_t step) {
        auto& c = *self->state.core;
        c.allowed = std::max(c.allowed, step);
        start_allowed_sums(self);
      },
      [=](const produced& m) { on_produced(self, m); },
      [=](drain_atom) -> caf::result<done_atom> { return self->state.core->io.drain(self); },
      [=](const released& m) { on_released(self, m); },
      [=](const grad_partial& m) {
        auto& c = *self->state.core;
        note_partial(c, trace_kind::recv, m.stage, c.index, m.step);
        handle(self, m.step, [&](reducer_state& st) { return st.on_partial(m.stage, m.step, m.sum_of_squares); });
      },
      [=](const work_done& d) { on_done(self, d); },
      [=](const work_failed& f) {
        auto& c = *self->state.core;
        self->quit(make_failure(runtime_errc::compute_failed, {c.plan.actor_name(c.id), f.step, f.what}));
      },
  };
}

} // namespace

caf::actor spawn_reducer(caf::actor_system& sys, const actor_setup& setup, std::uint32_t index, int tied_index,
                         std::vector<gradient_part> kept, bool presummed, const optimizer_compute* shard) {
  DSA_CHECK(!presummed || (!kept.empty() && !setup.plan->exchanges_tied()),
            "reducer {}: presummed gradients need kept parts and no tied exchange", index);
  return sys.spawn(reducer_behavior, setup, index, tied_index, std::move(kept), presummed, shard);
}

} // namespace dsa::actors
