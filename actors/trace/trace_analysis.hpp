// Questions answered from a trace: the compute spans of a stage in order, and
// each stage's measured idle fraction beside the theoretical pipeline bubble.
#pragma once

#include "actors/trace/trace_recorder.hpp"

#include <cstdint>
#include <vector>

namespace dsa::actors {

// Spans named `name` ("forward", "backward", "optimizer", "load") of one stage, by start time.
std::vector<trace_record> stage_spans(const trace_data& trace, const char* name, std::int32_t stage);
// Forward and backward spans of one stage, merged in start order.
std::vector<trace_record> stage_compute_spans(const trace_data& trace, std::int32_t stage);

// (S - 1) / (M + S - 1): the idle share of each stage in a balanced 1F1B or GPipe step.
double theoretical_bubble(std::uint32_t stages, std::uint32_t micro_batches);

struct stage_idle {
  std::int32_t stage = 0;
  double idle_fraction = 0; // 1 - busy / window, summed over steps
  double bubble = 0;        // theoretical_bubble(S, M)
};
// Per step, the window runs from the step's first forward to its last backward on
// any stage; busy time is the stage's forward and backward spans of that step.
std::vector<stage_idle> stage_idle_fractions(const trace_data& trace, std::uint32_t stages,
                                             std::uint32_t micro_batches);

struct comm_overlap {
  std::int32_t stage = 0;
  double allreduce_s = 0;  // total time of the stage's reducer in "allreduce" spans (gradient buckets)
  double overlapped_s = 0; // the part of it during the stage's "backward" spans
};
// Per stage: how much of its gradient sums over the data-parallel ranks ran while
// the stage was still in backward (overlap_comm). Stages without allreduce spans
// are left out.
std::vector<comm_overlap> allreduce_overlap(const trace_data& trace, std::uint32_t stages);

} // namespace dsa::actors
