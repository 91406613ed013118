// swap_store's buffer sets and what each holds (internal to io/aio/swap_store*.cpp).
#pragma once

#include "io/aio/swap_store.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace dsa::aio {

// The buffer sets and what each holds, kept across sweeps: a set may hold a chunk read
// ahead for the next sweep (prefetch) or a chunk still being written (write-behind).
struct swap_store::flight {
  enum class use { free, reading, ready, computing, writing };
  struct slot {
    use state = use::free;
    std::int64_t chunk = -1;
    unsigned mask = 0; // the arrays read into it
    int pending = 0;   // transfers not yet completed
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<slot> slots;
  std::optional<error> failed; // the first error of a transfer, not yet reported
  // A prefetch still under way: the arrays it reads and the next chunk to read. It goes on
  // as completions free buffer sets (a set freed by a write behind the last update takes the
  // next chunk), so read-ahead follows the buffer credits; a sweep or an error ends it.
  unsigned prefetch_mask = 0;
  std::int64_t prefetch_next = 0; // a position in the sweep order (swap_store::chunk_at)
  swap_stats stats;             // but the byte counts (the store's atomics)
  int active = 0;               // transfer() calls with a request not yet ended
  // Events a gated sweep (sweep_when) waits for: each completion and each wake(), counted
  // under mu so that one landing while the sweep has the lock released (around a submit)
  // is not lost.
  std::uint64_t events = 0;
  std::uint64_t busy_since = 0; // when `active` last left 0

  // A transfer of `s` ended (under mu).
  void ended(slot& s) {
    if (--s.pending > 0) return;
    if (s.state == use::reading) s.state = use::ready;
    else if (s.state == use::writing) s = slot{};
  }
  slot* holding(std::int64_t chunk) {
    for (auto& s : slots)
      if (s.chunk == chunk && (s.state == use::reading || s.state == use::ready)) return &s;
    return nullptr;
  }
  bool writing(std::int64_t chunk) const {
    return std::any_of(slots.begin(), slots.end(),
                       [&](const slot& s) { return s.chunk == chunk && s.state == use::writing; });
  }
  slot* free_slot() {
    for (auto& s : slots)
      if (s.state == use::free) return &s;
    return nullptr;
  }
  bool quiet() const {
    return std::all_of(slots.begin(), slots.end(), [](const slot& s) { return s.pending == 0; });
  }
};

} // namespace dsa::aio
