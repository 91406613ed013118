// The pipeline's bubble from a run's traces, however its stages were spread over
// processes: every rank's trace on the common clock (trace_clock.hpp), each step's window
// from the first compute span of any stage to the last, and each stage's idle share of
// those windows. What `dsactor bench pipeline` measures; beside it the mean forward,
// backward and (zero-bubble) weight span of each stage, and the most micro-batches a stage
// held between its forward and the end of their backward (W under zero-bubble): the
// activations it kept.
#pragma once

#include "actors/trace/analysis/trace_summary.hpp"
#include "core/error.hpp"

#include <cstdint>
#include <vector>

namespace dsa::actors {

struct pipeline_stage_figures {
  std::int32_t stage = 0;
  std::uint32_t rank = 0;   // the trace (process or in-process rank) that ran it
  double busy_s = 0;        // forward, backward and weight spans in the counted steps
  double idle_fraction = 0; // 1 - busy / the union of the counted steps' windows
  double forward_ms = 0, backward_ms = 0, weight_ms = 0; // mean spans (weight 0: none)
  std::uint32_t peak_held = 0;
};

struct pipeline_figures {
  std::uint32_t steps = 0; // counted
  double window_s = 0;     // the counted steps' windows, their union (steps may overlap)
  double bubble = 0;       // the stages' mean idle fraction
  std::vector<pipeline_stage_figures> stages; // by stage
};

// Counts steps from `skip_steps` after the first on (the first ones warm up). Each stage
// must come from one trace; a trace of data-parallel rank r > 0 of the same stages is left
// out (the first holder of a stage counts). Error: no compute spans in the counted steps.
expected<pipeline_figures> pipeline_bubble(const std::vector<rank_trace>& traces, std::uint32_t skip_steps);

// The bubbles theory gives for S stages, M micro-batches: 1F1B's (S - 1) / (M + S - 1), and
// the zero-bubble paper's from the measured mean F, B and W times: ZB-H1 (1F1B's memory)
// 1 - M (F + B + W) / (M (F + B + W) + (S - 1)(F + B - W)), ZB-H2 (2S - 1 micro-batches
// held) the same with (S - 1)(F + B - 2W); the floor (S - 1) F where the formula would pass
// below it.
double one_f_one_b_bubble(std::uint32_t stages, std::uint32_t micro_batches);
enum class zb_memory { h1, h2 };
double zb_bubble(zb_memory kind, std::uint32_t stages, std::uint32_t micro_batches, double f, double b, double w);

} // namespace dsa::actors
