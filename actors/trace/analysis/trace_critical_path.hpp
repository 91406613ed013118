// `dsactor trace RUN critical-path --step K`: the chain of spans and messages
// that determined when step K ended. From the step's last span (the one that
// ends last) the walk goes backwards: each span's start was bound by the latest
// of its actor's previous span, the arrival of its input, or the release of its
// output slot (trace_waits.hpp); a message edge continues at the sender's last
// span that started before the send. The walk stops at the first span that
// starts at or before the step's first span (or at a sender without spans).
#pragma once

#include "actors/trace/analysis/trace_summary.hpp"
#include "actors/trace/analysis/trace_waits.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::actors {

struct path_link {
  std::size_t span = 0;         // record index of the span on the path
  span_bound bound = span_bound::first; // what bound its start
  std::int64_t message = -1;    // input/credit: the receipt record
  std::int64_t sent = -1;       // its send record (-1: not in the trace)
  std::uint64_t wait_ns = 0;    // bound's time to the span's start
};

struct critical_path {
  std::uint32_t rank = 0, step = 0;
  std::uint64_t start_ns = 0, end_ns = 0; // the step's first span start, last span end
  std::vector<path_link> links;           // in time order (first link starts the path)
  struct share {
    std::string actor;
    double busy_s = 0; // its spans on the path
  };
  std::vector<share> shares; // by busy time, largest first
  double gaps_s = 0;         // the rest of the step: messages in flight, waits and dispatch
};

// The critical path of `step` in one rank's trace; an error when the trace has no span of it.
expected<critical_path> find_critical_path(const trace_data& trace, std::uint32_t rank, std::uint32_t step);
// The walk itself, back from span record `last` to the step's start `start_ns`
// (the summary runs it for every step on one index).
critical_path walk_critical_path(const trace_data& trace, const trace_index& index, std::size_t last,
                                 std::uint64_t start_ns);
// "stage 1 86%, stage 0 12%": the largest shares of the step on the path.
std::string critical_path_shares(const critical_path& path, std::size_t most = 3);
std::string format_critical_path(const trace_data& trace, const critical_path& path);

} // namespace dsa::actors
