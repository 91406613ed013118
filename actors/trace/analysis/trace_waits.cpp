// Span waits; see trace_waits.hpp.
#include "actors/trace/analysis/trace_waits.hpp"

#include "actors/trace/analysis/trace_summary.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

namespace dsa::actors {

namespace {

bool is(const trace_record& r, trace_kind kind, int name) {
  return name >= 0 && r.kind == static_cast<std::uint8_t>(kind) && r.name == name;
}

int name_index(const trace_data& t, const char* name) {
  for (std::size_t i = 0; i < t.names.size(); ++i)
    if (t.names[i] == name) return static_cast<int>(i);
  return -1;
}

// One actor's record indices by kind, each in time order (records are sorted by t0).
struct actor_records {
  std::vector<std::size_t> spans, produced_in, released_in, produced_out;
};

// Replays one kind of receipt in time order, keeping the latest per key: the
// walk over an actor's spans advances it, so the whole pass stays linear.
template <class Key> struct latest_by {
  latest_by(const trace_data& trace, const std::vector<std::size_t>& receipts, Key (*key_of)(const trace_record&))
      : t(trace), ids(receipts), key(key_of) {}
  const trace_data& t;
  const std::vector<std::size_t>& ids;
  Key (*key)(const trace_record&);
  std::size_t next = 0;
  std::map<Key, std::size_t> latest;
  void advance_to(std::uint64_t at) {
    for (; next < ids.size() && t.records[ids[next]].t0_ns <= at; ++next) latest[key(t.records[ids[next]])] = ids[next];
  }
  std::int64_t find(const Key& k) const {
    auto it = latest.find(k);
    return it == latest.end() ? -1 : static_cast<std::int64_t>(it->second);
  }
};

using pair_key = std::pair<std::uint32_t, std::uint32_t>;
pair_key step_micro_batch(const trace_record& r) { return {r.step, r.micro_batch}; }
std::uint32_t step_only(const trace_record& r) { return r.step; }
pair_key edge_slot(const trace_record& r) { return {r.edge, r.slot}; }

} // namespace

const char* span_bound_string(span_bound b) {
  switch (b) {
    case span_bound::first: return "first";
    case span_bound::previous: return "previous span";
    case span_bound::input: return "input";
    case span_bound::credit: return "credit";
  }
  return "?";
}

std::string trace_actor_name(const trace_data& trace, std::uint32_t actor) {
  return actor < trace.actors.size() && !trace.actors[actor].empty() ? trace.actors[actor]
                                                                      : fmt::format("actor {}", actor);
}

trace_index::trace_index(const trace_data& trace) : timelines(actor_timelines(trace)) {
  wait_of.assign(trace.records.size(), nullptr);
  for (const auto& tl : timelines)
    for (const auto& w : tl.spans) wait_of[w.span] = &w;
  for (std::size_t i = 0; i < trace.records.size(); ++i)
    if (trace.records[i].kind == static_cast<std::uint8_t>(trace_kind::send)) sends_[trace.records[i].flow].push_back(i);
}

std::int64_t trace_index::matching_send(const trace_data& trace, std::size_t recv) const {
  const auto& r = trace.records[recv];
  auto it = sends_.find(r.flow);
  if (it == sends_.end()) return -1;
  for (const auto i : it->second) {
    const auto& s = trace.records[i];
    if (s.name == r.name && s.actor == r.peer && s.peer == r.actor) return static_cast<std::int64_t>(i);
  }
  return -1;
}

std::vector<actor_timeline> actor_timelines(const trace_data& t) {
  const int produced = name_index(t, "produced"), released = name_index(t, "released");
  std::vector<actor_records> by_actor;
  std::uint64_t lo = ~0ull, hi = 0;
  for (std::size_t i = 0; i < t.records.size(); ++i) {
    const auto& r = t.records[i];
    lo = std::min(lo, r.t0_ns);
    hi = std::max({hi, r.t0_ns, r.t1_ns});
    if (r.actor >= by_actor.size()) by_actor.resize(r.actor + 1);
    auto& a = by_actor[r.actor];
    // I/O spans (the NVMe swap) run on the aio engine, device spans on the GPU, beside the
    // actor's worker: not its work.
    if (r.kind == static_cast<std::uint8_t>(trace_kind::span)) {
      if (!is_beside_span(t.names[r.name])) a.spans.push_back(i);
    }
    else if (is(r, trace_kind::recv, produced)) a.produced_in.push_back(i);
    else if (is(r, trace_kind::recv, released)) a.released_in.push_back(i);
    else if (is(r, trace_kind::send, produced)) a.produced_out.push_back(i);
  }
  std::vector<actor_timeline> out(by_actor.size());
  for (std::uint32_t id = 0; id < by_actor.size(); ++id) {
    auto& tl = out[id];
    tl.actor = id;
    const auto& a = by_actor[id];
    if (a.spans.empty() && a.produced_in.empty() && a.released_in.empty() && a.produced_out.empty()) continue;
    std::int64_t latest = -1; // the earlier span that ended last
    std::uint64_t ready = lo;
    std::size_t next_send = 0;
    latest_by<pair_key> inputs{t, a.produced_in, step_micro_batch};
    latest_by<std::uint32_t> step_inputs{t, a.produced_in, step_only};
    latest_by<pair_key> releases{t, a.released_in, edge_slot};
    for (std::size_t k = 0; k < a.spans.size(); ++k) {
      const auto& s = t.records[a.spans[k]];
      span_wait w;
      w.span = a.spans[k];
      w.previous = latest;
      w.ready_ns = ready;
      inputs.advance_to(s.t0_ns);
      step_inputs.advance_to(s.t0_ns);
      releases.advance_to(s.t0_ns);
      // Forward and backward work on one micro-batch; the other spans (reduce,
      // optimizer, load, allreduce) gather messages numbered otherwise.
      const auto& kind = t.names[s.name];
      w.input = kind == "forward" || kind == "backward" || kind == "weight" ? inputs.find({s.step, s.micro_batch})
                                                         : step_inputs.find(s.step);
      // Output slots: produced sends from this span's start to the next span's start.
      const std::uint64_t until = k + 1 < a.spans.size() ? t.records[a.spans[k + 1]].t0_ns : ~0ull;
      while (next_send < a.produced_out.size() && t.records[a.produced_out[next_send]].t0_ns < s.t0_ns) ++next_send;
      for (std::size_t j = next_send; j < a.produced_out.size(); ++j) {
        const auto& p = t.records[a.produced_out[j]];
        if (p.t0_ns >= until) break;
        const std::int64_t release = releases.find({p.edge, p.slot});
        if (release >= 0 && (w.credit < 0 || t.records[release].t0_ns > t.records[w.credit].t0_ns)) w.credit = release;
      }
      const std::uint64_t in_t = w.input >= 0 ? t.records[w.input].t0_ns : 0;
      const std::uint64_t credit_t = w.credit >= 0 ? t.records[w.credit].t0_ns : 0;
      if (s.t0_ns > ready) {
        const std::uint64_t a_end = std::clamp(in_t, ready, s.t0_ns);
        const std::uint64_t b_end = std::clamp(credit_t, a_end, s.t0_ns);
        w.input_wait_ns = a_end - ready;
        w.credit_wait_ns = b_end - a_end;
        w.idle_ns = s.t0_ns - b_end;
      }
      // The latest event binds; on a tie the previous span does (no message on the path).
      w.bound = latest >= 0 ? span_bound::previous : span_bound::first;
      w.bound_ns = latest >= 0 ? ready : lo;
      if (w.input >= 0 && in_t > w.bound_ns) {
        w.bound = span_bound::input;
        w.bound_ns = in_t;
      }
      if (w.credit >= 0 && credit_t > w.bound_ns) {
        w.bound = span_bound::credit;
        w.bound_ns = credit_t;
      }
      tl.input_wait_ns += w.input_wait_ns;
      tl.credit_wait_ns += w.credit_wait_ns;
      tl.idle_ns += w.idle_ns;
      if (s.t1_ns > ready || latest < 0) {
        ready = std::max(ready, s.t1_ns);
        latest = static_cast<std::int64_t>(a.spans[k]);
      }
      tl.spans.push_back(w);
    }
    tl.tail_idle_ns = hi > ready ? hi - ready : 0;
    tl.idle_ns += tl.tail_idle_ns;
  }
  return out;
}

} // namespace dsa::actors
