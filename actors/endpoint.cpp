// Data-plane sends and receives with sequence checks and trace records.
#include "actors/endpoint.hpp"

#include "core/error.hpp"

namespace dsa::actors {

endpoint::endpoint(std::shared_ptr<slot_table> slots, trace_recorder* trace, std::uint32_t actor,
                   std::int32_t stage)
    : slots_(std::move(slots)), trace_(trace), actor_(actor), stage_(stage) {
  const auto edges = slots_->edge_count();
  produced_sent_.assign(edges, 0);
  released_sent_.assign(edges, 0);
  produced_seen_.assign(edges, 0);
  released_seen_.assign(edges, 0);
}

void endpoint::note(trace_kind kind, trace_name name, std::uint32_t peer, slot_ref ref, std::uint64_t seq,
                    std::uint64_t bytes, std::uint32_t step, std::uint32_t micro_batch) {
  if (!trace_) return;
  trace_record r;
  r.t0_ns = trace_->now_ns();
  r.kind = static_cast<std::uint8_t>(kind);
  r.name = static_cast<std::uint16_t>(name);
  r.actor = actor_;
  r.stage = stage_;
  r.peer = peer;
  r.edge = ref.edge;
  r.slot = ref.slot;
  r.bytes = bytes;
  r.flow = flow_id(name, ref.edge, seq);
  r.step = step;
  r.micro_batch = micro_batch;
  trace_->record(r);
}

void endpoint::send_produced(caf::event_based_actor* self, const caf::actor& dest, std::uint32_t peer,
                             slot_ref ref, std::uint32_t step, std::uint32_t micro_batch) {
  self->send(dest, stamp_produced(peer, ref, step, micro_batch));
}

produced endpoint::stamp_produced(std::uint32_t peer, slot_ref ref, std::uint32_t step, std::uint32_t micro_batch) {
  produced msg{ref, step, micro_batch, slots_->bytes(ref), produced_sent_.at(ref.edge)++};
  note(trace_kind::send, trace_name::produced, peer, ref, msg.seq, msg.bytes, step, micro_batch);
  return msg;
}

void endpoint::send_released(caf::event_based_actor* self, const caf::actor& dest, std::uint32_t peer,
                             slot_ref ref) {
  released msg{ref, released_sent_.at(ref.edge)++};
  note(trace_kind::send, trace_name::released, peer, ref, msg.seq, 0, 0, 0);
  self->send(dest, msg);
}

status endpoint::check_arrival(const char* what, slot_ref ref, std::uint64_t seq,
                               const std::vector<std::uint64_t>& seen) const {
  if (ref.edge >= seen.size())
    return make_error(errc::protocol, "{} on edge {}, which the plan does not have ({} edges)", what, ref.edge,
                      seen.size());
  if (ref.slot >= slots_->slot_count(ref.edge))
    return make_error(errc::protocol, "{} on edge {} ({}) names slot {} of {}", what, ref.edge,
                      slots_->edge_name(ref.edge), ref.slot, slots_->slot_count(ref.edge));
  if (seq != seen[ref.edge])
    return make_error(errc::protocol, "{} on edge {} ({}) with sequence number {}, expected {}", what, ref.edge,
                      slots_->edge_name(ref.edge), seq, seen[ref.edge]);
  return {};
}

status endpoint::received(const produced& msg, std::uint32_t peer) {
  DSA_TRY(check_arrival("produced", msg.ref, msg.seq, produced_seen_));
  ++produced_seen_[msg.ref.edge];
  note(trace_kind::recv, trace_name::produced, peer, msg.ref, msg.seq, msg.bytes, msg.step, msg.micro_batch);
  return {};
}

status endpoint::received(const released& msg, std::uint32_t peer) {
  DSA_TRY(check_arrival("released", msg.ref, msg.seq, released_seen_));
  ++released_seen_[msg.ref.edge];
  note(trace_kind::recv, trace_name::released, peer, msg.ref, msg.seq, 0, 0, 0);
  if (drain_.pending() && released_seen_ == produced_sent_) drain_.deliver(done_atom::value);
  return {};
}

caf::result<done_atom> endpoint::drain(caf::event_based_actor* self) {
  if (drain_.pending()) drain_.deliver(caf::make_error(caf::sec::runtime_error)); // superseded
  if (released_seen_ == produced_sent_) return done_atom::value;
  drain_ = self->make_response_promise();
  return drain_;
}

} // namespace dsa::actors
