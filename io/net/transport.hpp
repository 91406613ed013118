// Point-to-point byte transport between the ranks of a group: the one interface the
// collectives (io/net/communicator.hpp) are written against.
#pragma once

#include "core/error.hpp"
#include "io/net/completion.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace dsa::net {

// Distinguishes concurrent conversations between the same two ranks; the collectives
// use one tag per call (its sequence number).
using tag_t = std::uint64_t;

using bytes = std::vector<std::byte>;

// The end of a send_parts: wait() returns once the transport no longer reads the
// payload (the receiver has it, or the send failed), with the send's outcome. A
// default-constructed ticket is already complete.
class send_ticket {
public:
  send_ticket() = default;
  explicit send_ticket(std::shared_ptr<completion> done) : done_(std::move(done)) {}
  status wait() { return done_ ? done_->wait() : status{}; }
  // Whether wait() would return at once.
  bool done() const { return !done_ || done_->done(); }

private:
  std::shared_ptr<completion> done_;
};

// What recv_parts delivered: with `placed`, `message` holds the head and the payload is
// in the caller's buffer; otherwise the message was not head_bytes + payload_bytes long
// and `message` holds all of it (the caller's buffer is untouched).
struct received_parts {
  bytes message;
  bool placed = false;
};

// One rank's end of a group of size() ranks numbered 0..size()-1.
//
// Contract:
// - send() takes ownership of the message and returns once it is queued; it never
//   waits for the receiver (a buffered, eager send).
// - recv() blocks until a message from `peer` with `tag` arrives and returns it whole.
// - Messages from one rank to another with the same tag arrive in the order sent;
//   messages with different tags are independent.
// - abort() tears the whole group down: every receive blocked now or issued later, on
//   every rank, returns an error carrying the reason. A collective that fails on one
//   rank aborts the group, since its peers can no longer complete it.
// - A peer outside 0..size()-1 is an errc::invalid_argument error, not a crash.
//
// - send_parts/recv_parts move the same messages without copying the payload: a
//   message sent by one may be received by the other (or by send/recv); the defaults
//   below copy through send/recv, a transport between processes overrides them so the
//   payload goes from the sender's buffer straight into the receiver's.
//
// Threads: send/recv may be called concurrently from several threads when each uses
// its own tags (one communicator per thread, each on its own channel); the collectives
// run on dedicated communication threads, never on an actor thread. abort() may come
// from any thread.
//
// Implementations: local_transport (ranks as threads of one process) and ucx_transport
// (processes; UCX active messages, the receiver pulling large payloads).
class transport {
public:
  virtual ~transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual status send(int peer, tag_t tag, bytes message) = 0;
  virtual expected<bytes> recv(int peer, tag_t tag) = 0;
  virtual void abort(const error& reason) = 0;
  // The abort reason once the group was aborted (by any rank, or by the loss of a peer
  // the transport noticed), else nothing. Any thread; polled by waits that do not go
  // through the transport (the shared-memory allreduce).
  virtual std::optional<error> aborted() const = 0;
  // Rank r of this group is world rank world_rank(r) of the job (a subgroup maps its
  // members; a whole transport is the world). For reports that line ranks up.
  virtual int world_rank(int r) const { return r; }

  // Sends head followed by payload: (payload_bytes) as one message, reading the payload
  // from the caller's memory, which must stay valid and unchanged until the ticket's
  // wait() returns. Default: copies both into one message for send().
  virtual expected<send_ticket> send_parts(int peer, tag_t tag, bytes head, const void* payload,
                                           std::size_t payload_bytes);
  // Receives the next (peer, tag) message; when it is head_bytes + payload_bytes long, its
  // payload lands in payload: (payload_bytes). Default: recv() and a copy.
  virtual expected<received_parts> recv_parts(int peer, tag_t tag, std::size_t head_bytes,
                                              void* payload, std::size_t payload_bytes);

  // The bytes of the messages this rank sent (heads and payloads, each message counted
  // once; not the transport's own framing) over the transport's life. Any thread.
  std::uint64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }

protected:
  void count_sent(std::size_t bytes) { bytes_sent_.fetch_add(bytes, std::memory_order_relaxed); }

private:
  std::atomic<std::uint64_t> bytes_sent_{0};
};

} // namespace dsa::net
