// Actor view and run diff; see trace_views.hpp.
#include "actors/trace/analysis/trace_views.hpp"

#include "actors/trace/analysis/trace_waits.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace dsa::actors {

namespace {

double seconds(std::uint64_t ns) { return static_cast<double>(ns) * 1e-9; }
double ms(std::uint64_t ns) { return static_cast<double>(ns) * 1e-6; }

std::string span_label(const trace_data& t, const trace_record& r) {
  return fmt::format("{} s{} mb{}", t.names[r.name], r.step, r.micro_batch);
}

} // namespace

expected<std::uint32_t> find_trace_actor(const trace_data& t, const std::string& name) {
  std::vector<std::uint32_t> seen;
  std::vector<bool> has(t.actors.size(), false);
  for (const auto& r : t.records)
    if (r.actor < has.size()) has[r.actor] = true;
  for (std::uint32_t id = 0; id < t.actors.size(); ++id)
    if (has[id] || !t.actors[id].empty()) seen.push_back(id);
  for (const auto id : seen)
    if (trace_actor_name(t, id) == name) return id;
  std::vector<std::uint32_t> partial;
  for (const auto id : seen)
    if (trace_actor_name(t, id).find(name) != std::string::npos) partial.push_back(id);
  if (partial.size() == 1) return partial[0];
  std::string known;
  for (const auto id : seen) known += (known.empty() ? "" : ", ") + trace_actor_name(t, id);
  return make_error(errc::not_found, "{} actor '{}' in the trace; its actors are: {}",
                    partial.empty() ? "no" : "more than one", name, known);
}

std::string format_actor_view(const trace_data& t, std::uint32_t actor, std::optional<std::uint32_t> step) {
  const auto timelines = actor_timelines(t);
  std::map<std::size_t, const span_wait*> wait_of;
  if (actor < timelines.size())
    for (const auto& w : timelines[actor].spans) wait_of[w.span] = &w;
  std::uint64_t origin = t.records.empty() ? 0 : t.records.front().t0_ns;
  std::string out = fmt::format("{}: times in s from the trace's start, waits in ms before each span\n",
                                trace_actor_name(t, actor));
  out += fmt::format("  {:>10} {:<5} {:<22} {:>9}  {}\n", "time s", "what", "name", "dur ms", "details");
  // A step's rows: the actor's records from its first to its last of that step
  // (releases carry no step).
  std::uint64_t from = 0, to = ~0ull;
  if (step) {
    from = ~0ull;
    to = 0;
    for (const auto& r : t.records)
      if (r.actor == actor && r.step == *step && t.names[r.name] != "released") {
        from = std::min(from, r.t0_ns);
        to = std::max({to, r.t0_ns, r.t1_ns});
      }
  }
  std::uint64_t rows = 0;
  for (std::size_t i = 0; i < t.records.size(); ++i) {
    const auto& r = t.records[i];
    if (r.actor != actor || r.t0_ns < from || r.t0_ns > to) continue;
    ++rows;
    const auto kind = static_cast<trace_kind>(r.kind);
    if (kind == trace_kind::span) {
      const auto& w = *wait_of.at(i);
      out += fmt::format("  {:>10.6f} {:<5} {:<22} {:>9.3f}  waited: input {:.3f}, credit {:.3f}, idle {:.3f}; "
                         "bound by {}\n",
                         seconds(r.t0_ns - origin), "span", span_label(t, r), ms(r.t1_ns - r.t0_ns),
                         ms(w.input_wait_ns), ms(w.credit_wait_ns), ms(w.idle_ns), span_bound_string(w.bound));
      continue;
    }
    const bool send = kind == trace_kind::send;
    const bool release = t.names[r.name] == "released";
    out += fmt::format("  {:>10.6f} {:<5} {:<22} {:>9}  {} {} edge {} slot {}{}\n", seconds(r.t0_ns - origin),
                       send ? "send" : "recv", t.names[r.name], "", send ? "to" : "from", trace_actor_name(t, r.peer),
                       r.edge, r.slot,
                       release ? std::string() : fmt::format(", s{} mb{}, {} bytes", r.step, r.micro_batch, r.bytes));
  }
  if (actor < timelines.size()) {
    const auto& tl = timelines[actor];
    out += fmt::format("  whole trace: {} spans; waiting for input {:.3f} ms, for a credit {:.3f} ms, idle {:.3f} ms\n",
                       tl.spans.size(), ms(tl.input_wait_ns), ms(tl.credit_wait_ns), ms(tl.idle_ns));
  }
  if (rows == 0) out += step ? fmt::format("  (no record of step {})\n", *step) : "  (no record)\n";
  return out;
}

namespace {

// An actor's spans by start time, as labels, with their start times.
std::map<std::string, std::vector<std::size_t>> spans_by_actor(const trace_data& t) {
  std::map<std::string, std::vector<std::size_t>> out;
  for (std::size_t i = 0; i < t.records.size(); ++i)
    if (t.records[i].kind == static_cast<std::uint8_t>(trace_kind::span))
      out[trace_actor_name(t, t.records[i].actor)].push_back(i);
  return out;
}

void diff_rank(const rank_trace& ra, const rank_trace& rb, run_difference& out) {
  const auto& ta = ra.trace;
  const auto& tb = rb.trace;
  const auto sa = spans_by_actor(ta), sb = spans_by_actor(tb);
  const std::uint64_t oa = ta.records.empty() ? 0 : ta.records.front().t0_ns;
  const std::uint64_t ob = tb.records.empty() ? 0 : tb.records.front().t0_ns;
  for (const auto& [name, xs] : sa) {
    auto it = sb.find(name);
    if (it == sb.end()) {
      out.only_in_a.push_back(fmt::format("rank {}: {}", ra.rank, name));
      continue;
    }
    const auto& ys = it->second;
    for (std::size_t k = 0; k < std::max(xs.size(), ys.size()); ++k) {
      const bool hx = k < xs.size(), hy = k < ys.size();
      const std::string lx = hx ? span_label(ta, ta.records[xs[k]]) : "(no more spans)";
      const std::string ly = hy ? span_label(tb, tb.records[ys[k]]) : "(no more spans)";
      if (lx == ly) continue;
      schedule_difference d;
      d.rank = ra.rank;
      d.actor = name;
      d.index = k;
      const double txs = hx ? seconds(ta.records[xs[k]].t0_ns - oa) : -1;
      const double tys = hy ? seconds(tb.records[ys[k]].t0_ns - ob) : -1;
      d.a = hx ? fmt::format("{} at {:.6f} s", lx, txs) : lx;
      d.b = hy ? fmt::format("{} at {:.6f} s", ly, tys) : ly;
      d.time_s = hx && hy ? std::min(txs, tys) : std::max(txs, tys);
      out.actors.push_back(d);
      break;
    }
  }
  for (const auto& [name, ys] : sb)
    if (!sa.count(name)) out.only_in_b.push_back(fmt::format("rank {}: {}", rb.rank, name));
}

} // namespace

run_difference diff_runs(const std::vector<rank_trace>& a, const std::vector<rank_trace>& b) {
  run_difference out;
  for (const auto& ra : a)
    for (const auto& rb : b)
      if (ra.rank == rb.rank) diff_rank(ra, rb, out);
  std::stable_sort(out.actors.begin(), out.actors.end(),
                   [](const schedule_difference& x, const schedule_difference& y) { return x.time_s < y.time_s; });
  std::map<std::pair<std::uint32_t, std::uint32_t>, run_difference::step_change> steps;
  const auto sa = summarize_traces(a), sb = summarize_traces(b);
  for (const auto& s : sa.steps) {
    auto& c = steps[{s.rank, s.step}];
    c.rank = s.rank;
    c.step = s.step;
    c.a_s = s.time_s;
  }
  for (const auto& s : sb.steps) {
    auto& c = steps[{s.rank, s.step}];
    c.rank = s.rank;
    c.step = s.step;
    c.b_s = s.time_s;
  }
  for (const auto& [key, c] : steps) out.steps.push_back(c);
  return out;
}

std::string format_run_difference(const run_difference& d) {
  std::string out;
  if (d.actors.empty()) {
    out += "schedules: the same order of spans (name, step, micro-batch) on every actor\n";
  } else {
    const auto& f = d.actors.front();
    out += fmt::format("schedules first differ at {:.6f} s: rank {} {}, span #{}: A {}, B {}\n", f.time_s, f.rank,
                       f.actor, f.index, f.a, f.b);
    out += "per actor, the first span that differs\n";
    for (const auto& x : d.actors)
      out += fmt::format("  rank {} {:<14} span #{:<5} A: {:<34} B: {}\n", x.rank, x.actor, x.index, x.a, x.b);
  }
  for (const auto& n : d.only_in_a) out += fmt::format("only in A: {}\n", n);
  for (const auto& n : d.only_in_b) out += fmt::format("only in B: {}\n", n);
  out += fmt::format("steps\n  {:>4} {:>6} {:>10} {:>10} {:>9}\n", "rank", "step", "A ms", "B ms", "change");
  for (const auto& s : d.steps) {
    const auto cell = [](double v) { return v < 0 ? std::string("-") : fmt::format("{:.3f}", v * 1e3); };
    const std::string change =
        s.a_s > 0 && s.b_s >= 0 ? fmt::format("{:+.1f}%", 100 * (s.b_s - s.a_s) / s.a_s) : std::string("-");
    out += fmt::format("  {:>4} {:>6} {:>10} {:>10} {:>9}\n", s.rank, s.step, cell(s.a_s), cell(s.b_s), change);
  }
  return out;
}

} // namespace dsa::actors
