// Sending and receiving the data-plane messages (produced, released) of one
// actor: per-edge sequence numbers and a trace record for every send and
// receive. Owned by one actor's state; not thread-safe.
#pragma once

#include "actors/protocol/atoms.hpp"
#include "actors/protocol/messages.hpp"
#include "actors/slot_table.hpp"
#include "actors/trace/trace_recorder.hpp"
#include "core/error.hpp"

#include <caf/actor.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/response_promise.hpp>
#include <caf/result.hpp>

#include <cstdint>
#include <memory>
#include <vector>

namespace dsa::actors {

class endpoint {
public:
  endpoint(std::shared_ptr<slot_table> slots, trace_recorder* trace, std::uint32_t actor, std::int32_t stage);

  // Sends `produced` for a slot this actor wrote; `peer` is the receiver's actor id.
  void send_produced(caf::event_based_actor* self, const caf::actor& dest, std::uint32_t peer, slot_ref ref,
                     std::uint32_t step, std::uint32_t micro_batch);
  // Numbers and records a `produced` for a slot this actor wrote, for sending inside another message.
  produced stamp_produced(std::uint32_t peer, slot_ref ref, std::uint32_t step, std::uint32_t micro_batch);
  void send_released(caf::event_based_actor* self, const caf::actor& dest, std::uint32_t peer, slot_ref ref);
  // Record arrivals. A message naming an edge or slot the slot table does not
  // have, or out of sequence on its edge (FIFO per sender), is a protocol error:
  // the sender broke the protocol, so the receiver fails by name, not by abort.
  status received(const produced& msg, std::uint32_t peer);
  status received(const released& msg, std::uint32_t peer);
  // The run's end (drain_atom from the coordinator, after the last step, when nothing more
  // is produced): done once every slot this actor wrote has been released; at once when
  // none is out, else from the release that brings the last one back (from another
  // process's actor it may still be on its way: after the actor's exit it would go
  // unrecorded). A second drain while one waits answers the first with an error.
  caf::result<done_atom> drain(caf::event_based_actor* self);

  slot_table& slots() { return *slots_; }
  trace_recorder* trace() const { return trace_; }
  std::uint32_t actor() const { return actor_; }
  std::int32_t stage() const { return stage_; }

private:
  status check_arrival(const char* what, slot_ref ref, std::uint64_t seq, const std::vector<std::uint64_t>& seen) const;
  void note(trace_kind kind, trace_name name, std::uint32_t peer, slot_ref ref, std::uint64_t seq,
            std::uint64_t bytes, std::uint32_t step, std::uint32_t micro_batch);

  std::shared_ptr<slot_table> slots_;
  trace_recorder* trace_;
  std::uint32_t actor_;
  std::int32_t stage_;
  std::vector<std::uint64_t> produced_sent_, released_sent_, produced_seen_, released_seen_;
  caf::response_promise drain_; // pending while a drain waits for releases
};

} // namespace dsa::actors
