// The NVMe engine actor's scheduling, without CAF: requests wait in priority order
// (io_priority, arrival order within a class) and start on their engine only while it
// has credits, so a read a gather or an update waits for overtakes the prefetches and
// writes behind still waiting, and memory pinned in flight stays bounded.
#pragma once

#include "io/aio/aio_config.hpp"
#include "io/aio/submitter.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace dsa::actors {

// How much one engine may have in flight. A request is started while fewer than
// `requests` are in flight and either fewer than `always` are (the engine's thread then
// finds the next request queued when one ends, whatever its size) or the bytes in
// flight stay within `bytes`.
struct io_credits {
  std::size_t requests = 8;
  std::uint64_t bytes = std::uint64_t{8} << 20;
  std::size_t always = 2;
};
// [aio]'s queue: queue_depth x intra_op_parallelism requests, of block_size bytes each.
io_credits io_credits_of(const aio::aio_config& config);

// One request as the scheduler sees it: the actor keeps the request itself.
struct io_ticket {
  std::uint64_t id = 0;
  std::uint32_t engine = 0; // index into the engines' credits
  aio::io_priority priority = aio::io_priority::update;
  std::uint64_t bytes = 0;
};

class io_schedule {
public:
  explicit io_schedule(std::vector<io_credits> engines);

  // A request arrived (ticket.engine must name one of the engines).
  void push(const io_ticket& ticket);
  // The waiting requests the credits let start now, most urgent first; they count as in
  // flight from here. A request its engine cannot take yet holds back that engine's less
  // urgent ones (no small request overtakes a large, more urgent one for ever).
  std::vector<io_ticket> admit();
  // A request admitted earlier has ended: its credits come back.
  void ended(const io_ticket& ticket);

  bool idle() const { return waiting_.empty() && in_flight_total_ == 0; }
  std::size_t waiting() const { return waiting_.size(); }
  std::size_t in_flight(std::uint32_t engine) const { return flight_.at(engine).requests; }
  std::uint64_t in_flight_bytes(std::uint32_t engine) const { return flight_.at(engine).bytes; }
  // The most requests that were ever in flight on `engine` at once.
  std::size_t peak_in_flight(std::uint32_t engine) const { return flight_.at(engine).peak; }

private:
  struct flight {
    std::size_t requests = 0, peak = 0;
    std::uint64_t bytes = 0;
  };
  bool fits(const io_ticket& t) const;

  std::vector<io_credits> credits_;
  std::vector<flight> flight_;
  std::size_t in_flight_total_ = 0;
  std::uint64_t arrivals_ = 0;
  // (priority, arrival) -> ticket: iteration is the order requests start in.
  std::map<std::pair<std::uint8_t, std::uint64_t>, io_ticket> waiting_;
};

} // namespace dsa::actors
