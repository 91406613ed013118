// Several processes' traces on one clock. Each trace's times count from its recorder's
// origin; its info frame says where that origin lies: on the steady clock
// (origin_steady_ns, CLOCK_MONOTONIC, which every process of one boot of a host shares:
// boot_id names the boot) and on the system clock (origin_unix_ns). Under a launcher it
// also says where the rendezvous server's steady clock stood against its own, measured by
// round trips at the rendezvous (clock_reference, clock_reference_offset_ns and
// clock_reference_error_ns; io/net/rendezvous_client.hpp, estimate_server_clock). Traces
// of one boot are placed exactly; traces of several hosts on the server's clock, within
// the estimates' error bounds, or else by their system clocks, as close as the hosts'
// clock synchronisation (NTP) keeps them; an older trace without these facts keeps its
// own origin, and the result says which it was.
#pragma once

#include "actors/trace/analysis/trace_summary.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::actors {

struct trace_clocks {
  // Per trace (in the order given): ns to add to its times to put them on the common clock,
  // whose zero is the earliest origin (so every offset is >= 0).
  std::vector<std::uint64_t> offset_ns;
  std::string how; // one line for the summary, e.g. "one host (boot 3f2a...): exact"
};

trace_clocks align_trace_clocks(const std::vector<rank_trace>& traces);

// `t` with every time moved `offset_ns` later (spans' ends too): one rank's trace on the
// common clock, for the views that read a single rank.
trace_data shifted_trace(trace_data t, std::uint64_t offset_ns);

} // namespace dsa::actors
