// Trace queries; see trace_analysis.hpp.
#include "actors/trace/trace_analysis.hpp"

#include <algorithm>
#include <cstring>
#include <map>

namespace dsa::actors {

std::vector<trace_record> stage_spans(const trace_data& trace, const char* name, std::int32_t stage) {
  std::vector<trace_record> out;
  for (const auto& r : trace.records)
    if (r.kind == static_cast<std::uint8_t>(trace_kind::span) && r.stage == stage &&
        trace.names.at(r.name) == name)
      out.push_back(r);
  std::stable_sort(out.begin(), out.end(),
                   [](const trace_record& a, const trace_record& b) { return a.t0_ns < b.t0_ns; });
  return out;
}

std::vector<trace_record> stage_compute_spans(const trace_data& trace, std::int32_t stage) {
  auto out = stage_spans(trace, "forward", stage);
  auto backward = stage_spans(trace, "backward", stage);
  auto weight = stage_spans(trace, "weight", stage); // zero-bubble's deferred W
  out.insert(out.end(), backward.begin(), backward.end());
  out.insert(out.end(), weight.begin(), weight.end());
  std::stable_sort(out.begin(), out.end(),
                   [](const trace_record& a, const trace_record& b) { return a.t0_ns < b.t0_ns; });
  return out;
}

double theoretical_bubble(std::uint32_t stages, std::uint32_t micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

std::vector<stage_idle> stage_idle_fractions(const trace_data& trace, std::uint32_t stages,
                                             std::uint32_t micro_batches) {
  struct window {
    std::uint64_t begin = ~0ull, end = 0;
  };
  std::map<std::uint32_t, window> steps;
  std::vector<std::uint64_t> busy(stages, 0);
  for (std::uint32_t s = 0; s < stages; ++s)
    for (const auto& r : stage_compute_spans(trace, static_cast<std::int32_t>(s))) {
      auto& w = steps[r.step];
      w.begin = std::min(w.begin, r.t0_ns);
      w.end = std::max(w.end, r.t1_ns);
      busy[s] += r.t1_ns - r.t0_ns;
    }
  std::uint64_t total = 0;
  for (const auto& [step, w] : steps) total += w.end - w.begin;
  std::vector<stage_idle> out;
  for (std::uint32_t s = 0; s < stages; ++s) {
    stage_idle idle;
    idle.stage = static_cast<std::int32_t>(s);
    idle.bubble = theoretical_bubble(stages, micro_batches);
    double share = total ? static_cast<double>(busy[s]) / static_cast<double>(total) : 0.0;
    // Not clamped: a stage's spans never overlap and lie inside the step windows,
    // so a value outside [0, 1] is a bug the tests should see.
    idle.idle_fraction = 1.0 - share;
    out.push_back(idle);
  }
  return out;
}

std::vector<comm_overlap> allreduce_overlap(const trace_data& trace, std::uint32_t stages) {
  std::vector<comm_overlap> out;
  for (std::uint32_t s = 0; s < stages; ++s) {
    const auto stage = static_cast<std::int32_t>(s);
    const auto backward = stage_spans(trace, "backward", stage);
    const auto sums = stage_spans(trace, "allreduce", stage);
    if (sums.empty()) continue;
    comm_overlap o;
    o.stage = stage;
    for (const auto& a : sums) {
      o.allreduce_s += static_cast<double>(a.t1_ns - a.t0_ns) * 1e-9;
      // Backward spans of one stage never overlap each other (one worker).
      for (const auto& b : backward) {
        const std::uint64_t lo = std::max(a.t0_ns, b.t0_ns), hi = std::min(a.t1_ns, b.t1_ns);
        if (hi > lo) o.overlapped_s += static_cast<double>(hi - lo) * 1e-9;
      }
    }
    out.push_back(o);
  }
  return out;
}

} // namespace dsa::actors
