// The NVMe engine actor's scheduling; see nvme_engine_state.hpp.
#include "actors/nvme_engine_state.hpp"

#include "core/error.hpp"

#include <algorithm>

namespace dsa::actors {

io_credits io_credits_of(const aio::aio_config& config) {
  io_credits c;
  c.requests =
      std::max<std::size_t>(1, std::size_t{config.queue_depth} * config.intra_op_parallelism);
  c.bytes = static_cast<std::uint64_t>(c.requests) * config.block_size;
  c.always = std::min<std::size_t>(2, c.requests);
  return c;
}

io_schedule::io_schedule(std::vector<io_credits> engines)
    : credits_(std::move(engines)), flight_(credits_.size()) {}

void io_schedule::push(const io_ticket& ticket) {
  DSA_CHECK(ticket.engine < credits_.size(), "nvme engine: request {} for engine {} of {}",
            ticket.id, ticket.engine, credits_.size());
  waiting_.emplace(std::make_pair(static_cast<std::uint8_t>(ticket.priority), arrivals_++), ticket);
}

bool io_schedule::fits(const io_ticket& t) const {
  const io_credits& c = credits_[t.engine];
  const flight& f = flight_[t.engine];
  return f.requests < c.requests && (f.requests < c.always || f.bytes + t.bytes <= c.bytes);
}

std::vector<io_ticket> io_schedule::admit() {
  std::vector<io_ticket> out;
  std::vector<bool> held(credits_.size(),
                         false); // an engine whose most urgent waiting request did not fit
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    const io_ticket& t = it->second;
    if (held[t.engine] || !fits(t)) {
      held[t.engine] = true;
      ++it;
      continue;
    }
    flight& f = flight_[t.engine];
    ++f.requests;
    f.bytes += t.bytes;
    f.peak = std::max(f.peak, f.requests);
    ++in_flight_total_;
    out.push_back(t);
    it = waiting_.erase(it);
  }
  return out;
}

void io_schedule::ended(const io_ticket& ticket) {
  flight& f = flight_.at(ticket.engine);
  DSA_CHECK(f.requests > 0 && f.bytes >= ticket.bytes && in_flight_total_ > 0,
            "nvme engine: request {} ended on engine {} with {} requests ({} bytes) in flight",
            ticket.id, ticket.engine, f.requests, f.bytes);
  --f.requests;
  f.bytes -= ticket.bytes;
  --in_flight_total_;
}

} // namespace dsa::actors
