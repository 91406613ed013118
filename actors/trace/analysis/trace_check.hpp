// `dsactor trace RUN check`: invariants of a recorded schedule, verified on the
// traces of a run (one per data-parallel rank; trace_summary.hpp loads them):
//   slots:       per (edge, slot) the producer's `produced` sends and its
//                `released` receipts alternate, never more slots in flight on an
//                edge than the plan gave it (when the trace's info frame lists
//                the edges), and every produced slot is released by the end;
//   sequence:    per edge, `produced` and `released` carry sequence numbers
//                0, 1, 2 ... without a gap or repeat, on the sending and the
//                receiving side;
//   delivery:    every `produced`/`released` received was sent before, and
//                every one sent was received;
//   collectives: every rank issues the allreduce spans of each stage in the
//                same (step, bucket) order;
//   starvation:  no pipeline stage left a runnable forward or backward idle
//                longer than a tolerance (trace_starvation.hpp; credit
//                starvation names the edge whose release came last).
// A torn trace (a killed run) is checked up to its cut: what is still in flight
// there is reported, not counted as a violation.
#pragma once

#include "actors/trace/analysis/trace_summary.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dsa::actors {

struct trace_violation {
  std::string check; // slots, sequence, delivery, collectives, starvation
  std::uint32_t rank = 0;
  double time_s = 0; // on the rank's clock, from its recorder's origin
  std::string what;  // names the edge, slot, actors
};

struct trace_check_options {
  // Starvation: how long a stage may take to start a runnable span (its worker's wake-up).
  double idle_tolerance_ms = 200;
};

struct trace_check_result {
  std::vector<std::string> checked;     // one line per check that ran, with its counts
  std::vector<std::string> outstanding; // torn traces: what was in flight at the cut
  std::optional<trace_violation> first; // the earliest violation (by time, then check order)
};

trace_check_result check_traces(const std::vector<rank_trace>& traces, const trace_check_options& options = {});
std::string format_trace_check(const trace_check_result& result);

} // namespace dsa::actors
