// The starvation check of `dsactor trace RUN check` (trace_check.hpp): no
// pipeline stage held a runnable forward or backward idle.
//
// A stage picks its next work in the handler of the message that made it
// runnable, and its worker starts it at once. From the stage actor's own
// records, a span could not have been runnable before the latest of:
//   - the actor learning that its previous span ended: its first message sent
//     after that end (it sends before it picks new work), or the end itself
//     when it sent none;
//   - every message it received before the span started that may have enabled
//     it: each `released` (a credit on any edge it writes, the reducer's return
//     of the previous step's gradients included) and each `produced` for the
//     span's own or an earlier (step, micro-batch). Only a `produced` for later
//     work cannot have enabled it.
// If the span started more than the tolerance after that instant, the stage
// held runnable work idle: with the last enabler a release, credit starvation
// on that release's edge. The tolerance covers the worker's wake-up; a process
// stopped, or starved of CPU, for longer trips the check (raise the tolerance).
// Reducers and optimizer shards gather messages the trace does not tie to
// their spans, so they are not checked.
#pragma once

#include "actors/trace/trace_recorder.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace dsa::actors {

struct starvation_finding {
  std::uint64_t at_ns = 0; // when the span became runnable
  std::string what;        // the stage, the span, the edge that starved, the times
};

struct starvation_result {
  std::uint64_t spans = 0;  // forward and backward spans checked
  std::uint32_t stages = 0; // stage actors among them
  std::uint64_t longest_ns = 0; // the longest wait from runnable to start seen
  std::string longest;          // its stage and span
  std::optional<starvation_finding> first; // the earliest by at_ns
};

starvation_result find_starvation(const trace_data& trace, std::uint64_t tolerance_ns);

} // namespace dsa::actors
