// The sends of one collective whose payload the transport may still read. A collective
// waits for them before it returns, so no buffer goes back to the caller while a send
// reads it; on failure it aborts the transport first (the peers then drop what they have
// not pulled, which ends those sends) and still waits.
#pragma once

#include "io/net/transport.hpp"

#include <utility>
#include <vector>

namespace dsa::net {

class sends_in_flight {
public:
  explicit sends_in_flight(transport& t) : t_(t) {}
  sends_in_flight(const sends_in_flight&) = delete;
  sends_in_flight& operator=(const sends_in_flight&) = delete;

  void add(send_ticket ticket) { tickets_.push_back(std::move(ticket)); }
  // Waits for every send; the first failure, if any.
  status wait_all() {
    status first;
    for (auto& ticket : tickets_) {
      status s = ticket.wait();
      if (!s && first)
        first = s;
    }
    tickets_.clear();
    return first;
  }
  // Aborts the transport with `err`, waits for every send, returns `err`.
  error fail(error err) {
    t_.abort(err);
    (void)wait_all();
    return err;
  }
  // wait_all(), and fail() with its error if one failed.
  status finish() {
    status done = wait_all();
    if (!done)
      return fail(done.err());
    return {};
  }

private:
  transport& t_;
  std::vector<send_ticket> tickets_;
};

} // namespace dsa::net
