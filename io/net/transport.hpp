// Point-to-point byte transport between the ranks of a group: the one interface the
// collectives (io/net/communicator.hpp) are written against.
#pragma once

#include "core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dsa::net {

// Distinguishes concurrent conversations between the same two ranks; the collectives
// use one tag per call (its sequence number).
using tag_t = std::uint64_t;

using bytes = std::vector<std::byte>;

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
// Threads: one thread per rank calls send/recv (the collectives run on a dedicated
// communication thread, never on an actor thread); abort() may come from any thread.
//
// The shape fits a UCX active-message transport (not written yet): send() maps to
// ucp_am_send_nbx with the tag in the AM header, recv() to matching queued AM
// arrivals by (peer, tag) while progressing the worker, abort() to closing the
// endpoints and failing the waiters.
class transport {
public:
  virtual ~transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual status send(int peer, tag_t tag, bytes message) = 0;
  virtual expected<bytes> recv(int peer, tag_t tag) = 0;
  virtual void abort(const error& reason) = 0;
};

} // namespace dsa::net
