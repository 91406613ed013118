// Starvation of pipeline stages in a trace; see trace_starvation.hpp.
#include "actors/trace/analysis/trace_starvation.hpp"

#include "actors/trace/analysis/trace_edges.hpp"
#include "actors/trace/analysis/trace_waits.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

namespace dsa::actors {

namespace {

double seconds(std::uint64_t ns) { return static_cast<double>(ns) * 1e-9; }
double millis(std::uint64_t ns) { return static_cast<double>(ns) * 1e-6; }

bool kind_is(const trace_record& r, trace_kind k) { return r.kind == static_cast<std::uint8_t>(k); }

// One actor's messages, each list in time order (the trace's order).
struct actor_messages {
  std::vector<std::size_t> sent, received;
};

// First index in `ids` whose record starts at or after `at`.
std::size_t first_from(const trace_data& t, const std::vector<std::size_t>& ids, std::uint64_t at) {
  const auto it = std::lower_bound(ids.begin(), ids.end(), at,
                                   [&](std::size_t i, std::uint64_t v) { return t.records[i].t0_ns < v; });
  return static_cast<std::size_t>(it - ids.begin());
}

// Why a span became runnable when it did: the last enabling receipt, or its previous span.
struct runnable_since {
  std::uint64_t at_ns = 0;
  std::int64_t receipt = -1; // the last enabling receipt (-1: the previous span's end bound it)
};

class stage_walk {
public:
  stage_walk(const trace_data& t, std::uint64_t tolerance_ns)
      : t_(t), tolerance_(tolerance_ns), edges_(trace_edges(t)) {
    for (std::size_t i = 0; i < t.names.size(); ++i) {
      if (t.names[i] == "forward" || t.names[i] == "backward") work_.push_back(i);
      if (t.names[i] == "produced") produced_ = static_cast<int>(i);
      if (t.names[i] == "released") released_ = static_cast<int>(i);
    }
    for (std::size_t i = 0; i < t.records.size(); ++i) {
      const auto& r = t.records[i];
      if (kind_is(r, trace_kind::span)) continue;
      if (r.actor >= messages_.size()) messages_.resize(r.actor + 1);
      (kind_is(r, trace_kind::send) ? messages_[r.actor].sent : messages_[r.actor].received).push_back(i);
    }
  }

  starvation_result run() {
    starvation_result out;
    for (const auto& tl : actor_timelines(t_)) {
      bool stage = false;
      for (const auto& w : tl.spans) {
        const auto& s = t_.records[w.span];
        if (std::find(work_.begin(), work_.end(), s.name) == work_.end() || s.stage < 0) continue;
        stage = true;
        ++out.spans;
        const auto since = runnable(w);
        const std::uint64_t idle = s.t0_ns > since.at_ns ? s.t0_ns - since.at_ns : 0;
        if (idle > out.longest_ns) {
          out.longest_ns = idle;
          out.longest = fmt::format("{} {} s{} mb{}", trace_actor_name(t_, s.actor), t_.names[s.name], s.step,
                                    s.micro_batch);
        }
        if (idle > tolerance_ && (!out.first || since.at_ns < out.first->at_ns))
          out.first = starvation_finding{since.at_ns, describe(s, since)};
      }
      out.stages += stage;
    }
    return out;
  }

private:
  runnable_since runnable(const span_wait& w) const {
    const auto& s = t_.records[w.span];
    runnable_since since;
    const actor_messages none;
    const auto& m = s.actor < messages_.size() ? messages_[s.actor] : none;
    if (w.previous >= 0) { // the actor learned of the previous span's end at its first send after it
      const auto end = std::min(t_.records[static_cast<std::size_t>(w.previous)].t1_ns, s.t0_ns);
      const auto k = first_from(t_, m.sent, end);
      const bool sent = k < m.sent.size() && t_.records[m.sent[k]].t0_ns < s.t0_ns; // not the span's own output
      since.at_ns = sent ? t_.records[m.sent[k]].t0_ns : end;
    }
    // The latest receipt before the start that may have enabled the span.
    for (auto k = first_from(t_, m.received, s.t0_ns); k-- > 0;) {
      const auto& r = t_.records[m.received[k]];
      if (r.t0_ns <= since.at_ns) break;
      const bool later_work =
          r.name == produced_ && std::tie(r.step, r.micro_batch) > std::tie(s.step, s.micro_batch);
      if (later_work || (r.name != produced_ && r.name != released_)) continue;
      since.at_ns = r.t0_ns;
      since.receipt = static_cast<std::int64_t>(m.received[k]);
      break;
    }
    return since;
  }

  std::string describe(const trace_record& s, const runnable_since& since) const {
    std::string why = "once its previous span had ended (the actor's first message after that end)";
    if (since.receipt >= 0) {
      const auto& r = t_.records[static_cast<std::size_t>(since.receipt)];
      const auto edge = trace_edge_label(edges_, r.edge);
      why = r.name == released_
                ? fmt::format("when the release of slot {} of {} came from {} (credit starvation on {})", r.slot,
                              edge, trace_actor_name(t_, r.peer), edge)
                : fmt::format("when produced s{} mb{} came on {} slot {} from {}", r.step, r.micro_batch, edge,
                              r.slot, trace_actor_name(t_, r.peer));
    }
    return fmt::format("{} held {} s{} mb{} runnable from {:.6f} s, {}, and started it only at {:.6f} s: idle "
                       "{:.3f} ms, over the {:.3f} ms tolerance",
                       trace_actor_name(t_, s.actor), t_.names[s.name], s.step, s.micro_batch, seconds(since.at_ns),
                       why, seconds(s.t0_ns), millis(s.t0_ns - since.at_ns), millis(tolerance_));
  }

  const trace_data& t_;
  const std::uint64_t tolerance_;
  const std::map<std::uint32_t, trace_edge> edges_;
  std::vector<std::size_t> work_;
  int produced_ = -1, released_ = -1;
  std::vector<actor_messages> messages_;
};

} // namespace

starvation_result find_starvation(const trace_data& trace, std::uint64_t tolerance_ns) {
  return stage_walk(trace, tolerance_ns).run();
}

} // namespace dsa::actors
