// The critical path of a step; see trace_critical_path.hpp.
#include "actors/trace/analysis/trace_critical_path.hpp"

#include "actors/trace/analysis/trace_summary.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace dsa::actors {

namespace {

double seconds(std::uint64_t ns) { return static_cast<double>(ns) * 1e-9; }
double ms(std::uint64_t ns) { return static_cast<double>(ns) * 1e-6; }

bool counts_in_step(const trace_data& t, const trace_record& r, std::uint32_t step) {
  // Loads are left out as in the summary's step windows: they prepare the next step.
  return r.kind == static_cast<std::uint8_t>(trace_kind::span) && r.step == step && t.names[r.name] != "load" &&
         !is_beside_span(t.names[r.name]); // beside the actors' work (trace_waits.cpp)
}

// The sender's last span that started at or before its send: the work whose end sent it.
std::int64_t span_before_send(const actor_timeline& sender, const trace_data& t, std::uint64_t at) {
  const auto it = std::upper_bound(sender.spans.begin(), sender.spans.end(), at,
                                   [&](std::uint64_t x, const span_wait& w) { return x < t.records[w.span].t0_ns; });
  return it == sender.spans.begin() ? -1 : static_cast<std::int64_t>(std::prev(it)->span);
}

} // namespace

expected<critical_path> find_critical_path(const trace_data& t, std::uint32_t rank, std::uint32_t step) {
  std::int64_t last = -1;
  std::uint64_t start_ns = ~0ull;
  std::uint32_t max_step = 0;
  bool any = false;
  for (std::size_t i = 0; i < t.records.size(); ++i) {
    const auto& r = t.records[i];
    if (r.kind == static_cast<std::uint8_t>(trace_kind::span)) {
      max_step = std::max(max_step, r.step);
      any = true;
    }
    if (!counts_in_step(t, r, step)) continue;
    start_ns = std::min(start_ns, r.t0_ns);
    if (last < 0 || r.t1_ns > t.records[last].t1_ns) last = static_cast<std::int64_t>(i);
  }
  if (last < 0)
    return make_error(errc::not_found, "the trace of rank {} has no span of step {} ({})", rank, step,
                      any ? fmt::format("its steps are 0 .. {}", max_step) : std::string("it has no spans"));
  auto path = walk_critical_path(t, trace_index(t), static_cast<std::size_t>(last), start_ns);
  path.rank = rank;
  path.step = step;
  return path;
}

critical_path walk_critical_path(const trace_data& t, const trace_index& index, std::size_t last,
                                 std::uint64_t start_ns) {
  critical_path out;
  out.step = t.records[last].step;
  out.start_ns = start_ns;
  out.end_ns = t.records[last].t1_ns;
  std::vector<path_link> reversed;
  auto cur = static_cast<std::int64_t>(last);
  while (cur >= 0) {
    const span_wait& w = *index.wait_of.at(static_cast<std::size_t>(cur));
    const auto& s = t.records[cur];
    path_link link;
    link.span = static_cast<std::size_t>(cur);
    link.bound = w.bound;
    link.wait_ns = s.t0_ns > w.bound_ns ? s.t0_ns - w.bound_ns : 0;
    std::int64_t next = -1;
    if (w.bound == span_bound::previous) {
      next = w.previous;
    } else if (w.bound == span_bound::input || w.bound == span_bound::credit) {
      link.message = w.bound == span_bound::input ? w.input : w.credit;
      link.sent = index.matching_send(t, static_cast<std::size_t>(link.message));
      if (link.sent >= 0) {
        const auto& send = t.records[link.sent];
        next = span_before_send(index.timelines.at(send.actor), t, send.t0_ns);
      }
    }
    reversed.push_back(link);
    // Stop at the step's start, and never walk forward in time (a malformed trace).
    if (s.t0_ns <= out.start_ns || next < 0 || t.records[next].t0_ns >= s.t0_ns ||
        t.records[next].t1_ns <= out.start_ns)
      break;
    cur = next;
  }
  out.links.assign(reversed.rbegin(), reversed.rend());

  std::map<std::string, double> busy;
  double on_path = 0;
  for (const auto& l : out.links) {
    const auto& s = t.records[l.span];
    // Only the part inside the step counts toward the step's share.
    const std::uint64_t lo = std::max(s.t0_ns, out.start_ns);
    const double d = s.t1_ns > lo ? seconds(s.t1_ns - lo) : 0.0;
    busy[trace_actor_name(t, s.actor)] += d;
    on_path += d;
  }
  for (const auto& [actor, b] : busy) out.shares.push_back({actor, b});
  std::stable_sort(out.shares.begin(), out.shares.end(),
                   [](const critical_path::share& a, const critical_path::share& b) { return a.busy_s > b.busy_s; });
  out.gaps_s = std::max(0.0, seconds(out.end_ns - out.start_ns) - on_path);
  return out;
}

std::string critical_path_shares(const critical_path& p, std::size_t most) {
  const double step_s = seconds(p.end_ns - p.start_ns);
  std::string out;
  for (std::size_t i = 0; i < p.shares.size() && i < most; ++i)
    out += fmt::format("{}{} {:.0f}%", out.empty() ? "" : ", ", p.shares[i].actor,
                       step_s > 0 ? 100 * p.shares[i].busy_s / step_s : 0.0);
  return out;
}

std::string format_critical_path(const trace_data& t, const critical_path& p) {
  const double step_s = seconds(p.end_ns - p.start_ns);
  std::string out = fmt::format("critical path of step {} on rank {}: {:.3f} ms, from {:.6f} s to {:.6f} s\n", p.step,
                                p.rank, step_s * 1e3, seconds(p.start_ns), seconds(p.end_ns));
  std::size_t width = 18; // at least "(in flight, waits)"
  for (const auto& l : p.links) width = std::max(width, trace_actor_name(t, t.records[l.span].actor).size());
  out += fmt::format("  {:<{}} {:<24} {:>10} {:>10}  {}\n", "actor", width, "span", "start ms", "dur ms",
                     "its start was bound by");
  for (const auto& l : p.links) {
    const auto& s = t.records[l.span];
    const std::int64_t rel = static_cast<std::int64_t>(s.t0_ns) - static_cast<std::int64_t>(p.start_ns);
    std::string why;
    if (l.bound == span_bound::first) {
      why = "nothing earlier in the trace";
    } else if (l.bound == span_bound::previous) {
      why = fmt::format("its previous span (gap {:.3f} ms)", ms(l.wait_ns));
    } else {
      const auto& m = t.records[l.message];
      why = fmt::format("{} {} edge {} slot {} from {}", l.bound == span_bound::input ? "input:" : "credit:",
                        t.names[m.name], m.edge, m.slot, trace_actor_name(t, m.peer));
      if (l.sent >= 0)
        why += fmt::format(", in flight {:.3f} ms", ms(m.t0_ns - t.records[l.sent].t0_ns));
      why += fmt::format(", then {:.3f} ms to start", ms(l.wait_ns));
    }
    out += fmt::format("  {:<{}} {:<24} {:>10.3f} {:>10.3f}  {}\n", trace_actor_name(t, s.actor), width,
                       fmt::format("{} s{} mb{}", t.names[s.name], s.step, s.micro_batch),
                       static_cast<double>(rel) * 1e-6, ms(s.t1_ns - s.t0_ns), why);
  }
  out += "share of the step on the path\n";
  for (const auto& s : p.shares)
    out += fmt::format("  {:<{}} {:>10.3f} ms {:>6.1f}%\n", s.actor, width, s.busy_s * 1e3,
                       step_s > 0 ? 100 * s.busy_s / step_s : 0.0);
  out += fmt::format("  {:<{}} {:>10.3f} ms {:>6.1f}%\n", "(in flight, waits)", width, p.gaps_s * 1e3,
                     step_s > 0 ? 100 * p.gaps_s / step_s : 0.0);
  return out;
}

} // namespace dsa::actors
