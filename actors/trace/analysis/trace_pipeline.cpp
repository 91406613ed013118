// The pipeline's bubble across processes; see trace_pipeline.hpp.
#include "actors/trace/analysis/trace_pipeline.hpp"

#include "actors/trace/analysis/trace_clock.hpp"
#include "actors/trace/trace_analysis.hpp"

#include <algorithm>
#include <map>

namespace dsa::actors {

namespace {

struct stage_spans_of {
  std::uint32_t rank = 0;
  std::vector<trace_record> forward, backward, weight; // on the common clock
};

std::vector<trace_record> shifted(std::vector<trace_record> spans, std::uint64_t offset) {
  for (auto& r : spans) {
    r.t0_ns += offset;
    r.t1_ns += offset;
  }
  return spans;
}

double mean_ms(const std::vector<trace_record>& spans) {
  if (spans.empty()) return 0;
  double total = 0;
  for (const auto& r : spans) total += static_cast<double>(r.t1_ns - r.t0_ns);
  return total / static_cast<double>(spans.size()) * 1e-6;
}

// The most micro-batches between a forward's end and the end of their last backward part.
std::uint32_t peak_held(const stage_spans_of& s) {
  const auto& done = s.weight.empty() ? s.backward : s.weight;
  std::vector<std::pair<std::uint64_t, int>> events;
  for (const auto& r : s.forward) events.emplace_back(r.t1_ns, +1);
  for (const auto& r : done) events.emplace_back(r.t1_ns, -1);
  std::sort(events.begin(), events.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second < b.second; // ends first at a tie
  });
  int held = 0, peak = 0;
  for (const auto& [t, d] : events) peak = std::max(peak, held += d);
  return static_cast<std::uint32_t>(peak);
}

} // namespace

double one_f_one_b_bubble(std::uint32_t stages, std::uint32_t micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

double zb_bubble(zb_memory kind, std::uint32_t stages, std::uint32_t micro_batches, double f, double b, double w) {
  const double work = micro_batches * (f + b + w);
  const double hidden = kind == zb_memory::h2 ? 2 * w : w;
  const double extra = std::max((stages - 1) * (f + b - hidden), (stages - 1) * f);
  return work + extra > 0 ? extra / (work + extra) : 0.0;
}

expected<pipeline_figures> pipeline_bubble(const std::vector<rank_trace>& traces, std::uint32_t skip_steps) {
  const trace_clocks clocks = align_trace_clocks(traces);
  std::map<std::int32_t, stage_spans_of> by_stage;
  for (std::size_t i = 0; i < traces.size(); ++i) {
    const auto& t = traces[i].trace;
    const auto offset = clocks.offset_ns[i];
    for (std::int32_t s = 0; s < 256; ++s) {
      auto f = stage_spans(t, "forward", s);
      if (f.empty()) continue;
      if (by_stage.count(s)) continue; // another data-parallel rank of the same stage
      auto& out = by_stage[s];
      out.rank = traces[i].rank;
      out.forward = shifted(std::move(f), offset);
      out.backward = shifted(stage_spans(t, "backward", s), offset);
      out.weight = shifted(stage_spans(t, "weight", s), offset);
    }
  }
  if (by_stage.empty()) return make_error(errc::format, "the traces hold no forward spans");
  std::uint32_t first = ~0u;
  for (const auto& [s, spans] : by_stage)
    for (const auto& r : spans.forward) first = std::min(first, r.step);
  const std::uint32_t from = first + skip_steps;
  struct window {
    std::uint64_t begin = ~0ull, end = 0;
  };
  std::map<std::uint32_t, window> windows;
  auto counted = [&](const trace_record& r) { return r.step >= from; };
  for (const auto& [s, spans] : by_stage)
    for (const auto* list : {&spans.forward, &spans.backward, &spans.weight})
      for (const auto& r : *list)
        if (counted(r)) {
          auto& w = windows[r.step];
          w.begin = std::min(w.begin, r.t0_ns);
          w.end = std::max(w.end, r.t1_ns);
        }
  if (windows.empty())
    return make_error(errc::format, "no compute spans after the first {} step(s) of the traces", skip_steps);
  pipeline_figures out;
  out.steps = static_cast<std::uint32_t>(windows.size());
  // The union of the windows: a stage may start step k + 1 while another still finishes k.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
  for (const auto& [k, w] : windows) spans.emplace_back(w.begin, w.end);
  std::sort(spans.begin(), spans.end());
  std::uint64_t total = 0, reach = 0;
  for (const auto& [b, e] : spans) {
    const std::uint64_t from = std::max(b, reach);
    if (e > from) total += e - from;
    reach = std::max(reach, e);
  }
  out.window_s = static_cast<double>(total) * 1e-9;
  for (const auto& [s, spans] : by_stage) {
    pipeline_stage_figures f;
    f.stage = s;
    f.rank = spans.rank;
    std::uint64_t busy = 0;
    for (const auto* list : {&spans.forward, &spans.backward, &spans.weight})
      for (const auto& r : *list)
        if (counted(r)) busy += r.t1_ns - r.t0_ns;
    f.busy_s = static_cast<double>(busy) * 1e-9;
    f.idle_fraction = total ? 1.0 - static_cast<double>(busy) / static_cast<double>(total) : 0.0;
    f.forward_ms = mean_ms(spans.forward);
    f.backward_ms = mean_ms(spans.backward);
    f.weight_ms = mean_ms(spans.weight);
    f.peak_held = peak_held(spans);
    out.bubble += f.idle_fraction / static_cast<double>(by_stage.size());
    out.stages.push_back(f);
  }
  return out;
}

} // namespace dsa::actors
