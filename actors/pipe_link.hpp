// The messages between the actors of one pipeline replica whose stages run in different
// processes: `produced` with the slot's tensors, `released`, `grad_partial`. CAF-free:
// the run's proxy actors (link_proxy_actor.hpp) call send(), and the receiving threads
// hand each arrival to a callback that delivers it to the local actor.
//
// The slot credits are those of one process: a producer reuses slot i of an edge only
// after its consumer released it, and the receiving process writes an arrival into its
// own slot i of that edge, which is then free by the same rule. So the receiver pulls
// each payload straight into a free slot (transport::recv_parts: into a new tensor, as a
// producer inside a process puts a new tensor into the slot, since a consumer may keep
// what it read, e.g. a stage's stashed input) and a process never queues more than the
// edge's slot count; back-pressure is the credit, not a queue.
//
// On the wire (one tag, pipe_link_tag, per ordered pair of processes; FIFO): a head
// message (kind, target actor id, the message's fields, each tensor's dtype and shape),
// then one message per tensor of a `produced`, its bytes (send_parts: read from the
// sender's slot, which its credit keeps unchanged until the consumer released it).
// `end` says the sender's run is over; finish() waits for every peer's.
#pragma once

#include "actors/protocol/messages.hpp"
#include "actors/slot_table.hpp"
#include "core/error.hpp"
#include "io/net/transport.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <variant>
#include <vector>

namespace dsa::actors {

// The transport channel of the pipeline's messages (communicator.hpp's tag scheme:
// above every collective channel the runtime uses).
inline constexpr net::tag_t pipe_link_tag = net::tag_t{1} << 62;

using link_payload = std::variant<produced, released, grad_partial>;

class pipe_link {
public:
  // world: the job's transport (borrowed, outlives the link); slots: this process's
  // table; peers: the world ranks of the other processes of this replica's pipeline.
  pipe_link(net::transport& world, std::shared_ptr<slot_table> slots, std::vector<int> peers);
  ~pipe_link();
  pipe_link(const pipe_link&) = delete;
  pipe_link& operator=(const pipe_link&) = delete;

  // Called on a receiving thread for each arrival (its slot already written):
  // `target` is the plan's actor id of the local receiver.
  using deliver_fn = std::function<void(std::uint32_t target, const link_payload& message)>;
  // Starts one receiving thread per peer. A malformed message aborts the transport
  // (the job stops naming it); a transport error ends that thread quietly (the abort
  // reaches the run through transport::aborted()).
  void start(deliver_fn deliver);

  // Sends to actor `target` of process `process` (a peer). Any thread. A produced
  // ships the slot's tensors (host tensors only). After finish() it drops the message.
  status send(int process, std::uint32_t target, const link_payload& message);

  // Tells every peer this process sends nothing more, then waits for each peer's end
  // (or the transport's abort) and joins the receiving threads. Idempotent.
  void finish();

  // Stops the whole job with `why` (a send that cannot be made: the run would wait forever).
  void abort(const error& why) { world_.abort(why); }
  int process() const { return world_.rank(); }

  // Bytes of tensors sent and received (for the trace facts and tests).
  std::uint64_t payload_bytes_sent() const {
    std::lock_guard<std::mutex> lock(send_mutex_);
    return sent_bytes_;
  }

private:
  void receive_from(int peer, deliver_fn deliver);
  status receive_one(int peer, const deliver_fn& deliver, bool& ended);

  net::transport& world_;
  std::shared_ptr<slot_table> slots_;
  std::vector<int> peers_;
  mutable std::mutex send_mutex_; // one head and its payloads leave together; guards what follows
  // The sends still reading a slot's memory, by (edge, slot), with what keeps it alive.
  struct in_flight {
    net::send_ticket ticket;
    std::vector<tensor> keep;
  };
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::vector<in_flight>> in_flight_;
  std::uint64_t sent_bytes_ = 0;
  std::vector<std::thread> receivers_;
  bool finished_ = false; // finish() began: the end is sent, send() drops
};

} // namespace dsa::actors
