// The trace invariant checks; see trace_check.hpp.
#include "actors/trace/analysis/trace_check.hpp"

#include "actors/trace/analysis/trace_edges.hpp"
#include "actors/trace/trace_record.hpp"
#include "actors/trace/analysis/trace_starvation.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <unordered_map>

namespace dsa::actors {

namespace {

constexpr std::uint64_t seq_mask = (1ull << 40) - 1; // flow_id's sequence bits

double seconds(std::uint64_t ns) { return static_cast<double>(ns) * 1e-9; }

// What one rank's trace knows: its names resolved once, its edges from the info frame.
struct rank_view {
  const rank_trace& rt;
  int produced = -1, released = -1, allreduce = -1; // name indices, -1: not in the table
  std::map<std::uint32_t, trace_edge> edges;
  bool slot_counts = false;

  explicit rank_view(const rank_trace& r) : rt(r) {
    const auto& names = r.trace.names;
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (names[i] == "produced") produced = static_cast<int>(i);
      else if (names[i] == "released") released = static_cast<int>(i);
      else if (names[i] == "allreduce") allreduce = static_cast<int>(i);
    }
    edges = trace_edges(r.trace);
    slot_counts = !edges.empty();
  }
  bool complete() const { return rt.trace.end.closed; }
  std::string actor(std::uint32_t id) const {
    const auto& a = rt.trace.actors;
    return id < a.size() && !a[id].empty() ? a[id] : fmt::format("actor {}", id);
  }
  std::string edge(std::uint32_t id) const { return trace_edge_label(edges, id); }
  std::uint32_t slot_count(std::uint32_t id) const {
    auto it = edges.find(id);
    return it == edges.end() ? 0 : it->second.slots;
  }
  bool is(const trace_record& r, trace_kind kind, int name) const {
    return name >= 0 && r.kind == static_cast<std::uint8_t>(kind) && r.name == name;
  }
};

// Keeps the earliest violation; at equal times the check that ran first wins.
struct verdict {
  trace_check_result result;
  void offer(const char* check, std::uint32_t rank, std::uint64_t t_ns, std::string what) {
    const double t = seconds(t_ns);
    auto& f = result.first;
    if (f && std::make_tuple(f->time_s, f->rank) <= std::make_tuple(t, rank)) return;
    f = trace_violation{check, rank, t, std::move(what)};
  }
};

std::string at(const rank_view& v, const trace_record& r) {
  return fmt::format("rank {} at {:.6f} s", v.rt.rank, seconds(r.t0_ns));
}

// Slots: the producer's produced sends and released receipts, per (edge, slot), alternate.
void check_slots(const rank_view& v, verdict& out) {
  const auto& recs = v.rt.trace.records;
  std::vector<std::size_t> events;
  for (std::size_t i = 0; i < recs.size(); ++i)
    if (v.is(recs[i], trace_kind::send, v.produced) || v.is(recs[i], trace_kind::recv, v.released))
      events.push_back(i);
  // At one instant a release frees the slot before a produce reuses it.
  std::stable_sort(events.begin(), events.end(), [&](std::size_t a, std::size_t b) {
    const bool ra = recs[a].kind == static_cast<std::uint8_t>(trace_kind::recv);
    const bool rb = recs[b].kind == static_cast<std::uint8_t>(trace_kind::recv);
    return std::make_tuple(recs[a].t0_ns, !ra) < std::make_tuple(recs[b].t0_ns, !rb);
  });
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::size_t> in_flight; // -> its produced record
  std::map<std::uint32_t, std::uint32_t> per_edge;
  std::uint64_t produced = 0, released = 0;
  for (const auto i : events) {
    const auto& r = recs[i];
    const auto key = std::make_pair(r.edge, r.slot);
    const auto slots = v.slot_count(r.edge);
    if (r.kind == static_cast<std::uint8_t>(trace_kind::send)) {
      ++produced;
      if (slots > 0 && r.slot >= slots) {
        out.offer("slots", v.rt.rank, r.t0_ns,
                  fmt::format("{}: {} produced slot {} of {} to {}, but the edge has {} slots", at(v, r),
                              v.actor(r.actor), r.slot, v.edge(r.edge), v.actor(r.peer), slots));
        return;
      }
      if (auto it = in_flight.find(key); it != in_flight.end()) {
        const auto& prev = recs[it->second];
        out.offer("slots", v.rt.rank, r.t0_ns,
                  fmt::format("{}: slot over-committed: {} produced slot {} of {} to {} (step {}, micro-batch "
                              "{}) while its produce at {:.6f} s (step {}, micro-batch {}) was not released yet",
                              at(v, r), v.actor(r.actor), r.slot, v.edge(r.edge), v.actor(r.peer), r.step,
                              r.micro_batch, seconds(prev.t0_ns), prev.step, prev.micro_batch));
        return;
      }
      in_flight[key] = i;
      if (++per_edge[r.edge] > slots && slots > 0) {
        out.offer("slots", v.rt.rank, r.t0_ns,
                  fmt::format("{}: {} slots of {} in flight, the plan gives it {}", at(v, r), per_edge[r.edge],
                              v.edge(r.edge), slots));
        return;
      }
    } else {
      ++released;
      auto it = in_flight.find(key);
      if (it == in_flight.end()) {
        out.offer("slots", v.rt.rank, r.t0_ns,
                  fmt::format("{}: {} received the release of slot {} of {} from {}, but that slot was not in "
                              "flight",
                              at(v, r), v.actor(r.actor), r.slot, v.edge(r.edge), v.actor(r.peer)));
        return;
      }
      in_flight.erase(it);
      --per_edge[r.edge];
    }
  }
  bool failed = false;
  for (const auto& [key, i] : in_flight) {
    const auto& r = recs[i];
    auto what = fmt::format("slot {} of {}, produced by {} to {} at {:.6f} s (step {}, micro-batch {}), never "
                            "released",
                            r.slot, v.edge(r.edge), v.actor(r.actor), v.actor(r.peer), seconds(r.t0_ns), r.step,
                            r.micro_batch);
    if (v.complete()) {
      out.offer("slots", v.rt.rank, r.t0_ns, fmt::format("rank {}: {}", v.rt.rank, what));
      failed = true;
    } else
      out.result.outstanding.push_back(fmt::format("rank {}: in flight at the cut: {}", v.rt.rank, what));
  }
  if (failed) return;
  out.result.checked.push_back(
      fmt::format("slots (rank {}): {} produced and {} released alternate per slot{}", v.rt.rank, produced,
                  released,
                  v.slot_counts ? fmt::format(", within the plan's slot counts of {} edges", v.edges.size())
                                : std::string(" (the trace lists no slot counts: alternation only)")));
}

// Sequence numbers: per (edge, message, side), 0, 1, 2 ... in time order.
void check_sequence(const rank_view& v, verdict& out) {
  const auto& recs = v.rt.trace.records;
  std::map<std::tuple<std::uint32_t, std::uint16_t, std::uint8_t>, std::vector<std::size_t>> streams;
  for (std::size_t i = 0; i < recs.size(); ++i) {
    const auto& r = recs[i];
    if ((r.name == v.produced || r.name == v.released) && r.kind != static_cast<std::uint8_t>(trace_kind::span))
      streams[{r.edge, r.name, r.kind}].push_back(i);
  }
  std::uint64_t messages = 0;
  for (auto& [key, idx] : streams) {
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) {
      return std::make_pair(recs[a].t0_ns, recs[a].flow & seq_mask) <
             std::make_pair(recs[b].t0_ns, recs[b].flow & seq_mask);
    });
    std::uint64_t expect = 0;
    for (const auto i : idx) {
      const auto& r = recs[i];
      const auto seq = r.flow & seq_mask;
      ++messages;
      if (seq == expect) {
        ++expect;
        continue;
      }
      const bool send = r.kind == static_cast<std::uint8_t>(trace_kind::send);
      out.offer("sequence", v.rt.rank, r.t0_ns,
                fmt::format("{}: {} {} {} {} on {} with sequence number {}, expected {} ({})", at(v, r),
                            v.actor(r.actor), send ? "sent" : "received", v.rt.trace.names[r.name],
                            send ? "to " + v.actor(r.peer) : "from " + v.actor(r.peer), v.edge(r.edge), seq, expect,
                            seq < expect ? "a repeat" : fmt::format("{} missing", seq - expect)));
      return;
    }
  }
  out.result.checked.push_back(fmt::format(
      "sequence (rank {}): {} produced/released messages numbered without gaps on {} streams", v.rt.rank,
      messages, streams.size()));
}

// Delivery: every message received was sent (earlier), every one sent was received.
void check_delivery(const rank_view& v, verdict& out) {
  const auto& recs = v.rt.trace.records;
  std::unordered_map<std::uint64_t, std::size_t> sent;
  std::unordered_map<std::uint64_t, std::size_t> received;
  for (std::size_t i = 0; i < recs.size(); ++i) {
    const auto& r = recs[i];
    if (r.name != v.produced && r.name != v.released) continue;
    if (r.kind == static_cast<std::uint8_t>(trace_kind::send)) {
      if (!sent.emplace(r.flow, i).second) {
        out.offer("delivery", v.rt.rank, r.t0_ns,
                  fmt::format("{}: {} sent {} number {} on {} to {} a second time", at(v, r), v.actor(r.actor),
                              v.rt.trace.names[r.name], r.flow & seq_mask, v.edge(r.edge), v.actor(r.peer)));
        return;
      }
    } else if (r.kind == static_cast<std::uint8_t>(trace_kind::recv)) {
      received.emplace(r.flow, i);
    }
  }
  bool failed = false;
  for (const auto& [flow, i] : received) {
    const auto& r = recs[i];
    auto s = sent.find(flow);
    if (s == sent.end() || recs[s->second].t0_ns > r.t0_ns) {
      failed = true;
      out.offer("delivery", v.rt.rank, r.t0_ns,
                fmt::format("{}: {} received {} number {} on {} from {}, which {}", at(v, r), v.actor(r.actor),
                            v.rt.trace.names[r.name], flow & seq_mask, v.edge(r.edge), v.actor(r.peer),
                            s == sent.end() ? "was never sent" : "was sent only later"));
    }
  }
  for (const auto& [flow, i] : sent) {
    if (received.count(flow)) continue;
    const auto& r = recs[i];
    auto what = fmt::format("{} number {} on {} sent by {} to {} at {:.6f} s was never received",
                            v.rt.trace.names[r.name], flow & seq_mask, v.edge(r.edge), v.actor(r.actor),
                            v.actor(r.peer), seconds(r.t0_ns));
    if (v.complete()) {
      failed = true;
      out.offer("delivery", v.rt.rank, r.t0_ns,
                fmt::format("rank {}: {}{}", v.rt.rank, what, r.name == v.released ? " (a lost release)" : ""));
    } else
      out.result.outstanding.push_back(fmt::format("rank {}: in flight at the cut: {}", v.rt.rank, what));
  }
  if (failed) return;
  out.result.checked.push_back(fmt::format("delivery (rank {}): {} messages sent, {} received, matched",
                                           v.rt.rank, sent.size(), received.size()));
}

// Collectives: every rank's allreduce spans of a stage, in time order, list the same (step, bucket).
void check_collectives(const std::vector<rank_view>& views, verdict& out) {
  using call = std::pair<std::uint64_t, std::size_t>; // (t0, record)
  std::vector<std::map<std::int32_t, std::vector<call>>> per_rank(views.size());
  for (std::size_t k = 0; k < views.size(); ++k) {
    const auto& recs = views[k].rt.trace.records;
    for (std::size_t i = 0; i < recs.size(); ++i)
      if (views[k].is(recs[i], trace_kind::span, views[k].allreduce))
        per_rank[k][recs[i].stage].emplace_back(recs[i].t0_ns, i);
    for (auto& [stage, calls] : per_rank[k]) std::stable_sort(calls.begin(), calls.end());
  }
  if (views.size() < 2) {
    out.result.checked.push_back("collectives: one rank's trace: no order to compare");
    return;
  }
  std::uint64_t compared = 0;
  bool failed = false;
  const auto& ref = views[0];
  for (std::size_t k = 1; k < views.size(); ++k) {
    const auto& v = views[k];
    std::map<std::int32_t, bool> stages;
    for (const auto& [s, c] : per_rank[0]) stages[s] = true;
    for (const auto& [s, c] : per_rank[k]) stages[s] = true;
    for (const auto& [stage, unused] : stages) {
      const auto& a = per_rank[0][stage];
      const auto& b = per_rank[k][stage];
      const auto n = std::min(a.size(), b.size());
      bool differ = false;
      for (std::size_t i = 0; i < n && !differ; ++i) {
        const auto& ra = ref.rt.trace.records[a[i].second];
        const auto& rb = v.rt.trace.records[b[i].second];
        ++compared;
        if (ra.step == rb.step && ra.micro_batch == rb.micro_batch) continue;
        differ = failed = true;
        out.offer("collectives", v.rt.rank, rb.t0_ns,
                  fmt::format("{}: stage {}'s allreduce number {} differs between ranks: {} issued step {} bucket "
                              "{}, while rank {}'s {} issued step {} bucket {} at {:.6f} s",
                              at(v, rb), stage, i, v.actor(rb.actor), rb.step, rb.micro_batch, ref.rt.rank,
                              ref.actor(ra.actor), ra.step, ra.micro_batch, seconds(ra.t0_ns)));
      }
      if (differ || a.size() == b.size()) continue;
      auto what = fmt::format("stage {}: rank {} issued {} allreduces, rank {} issued {}", stage, ref.rt.rank,
                              a.size(), v.rt.rank, b.size());
      if (ref.complete() && v.complete()) {
        failed = true;
        const bool short_b = b.size() < a.size();
        const auto& extra = short_b ? ref.rt.trace.records[a[n].second] : v.rt.trace.records[b[n].second];
        out.offer("collectives", short_b ? ref.rt.rank : v.rt.rank, extra.t0_ns, what);
      } else {
        out.result.outstanding.push_back(what + " (a torn trace)");
      }
    }
  }
  if (failed) return;
  out.result.checked.push_back(fmt::format(
      "collectives: allreduce order of {} ranks compared with rank {} ({} calls)", views.size(), ref.rt.rank,
      compared));
}

// Starvation: a stage idle with runnable work while it handled other messages.
void check_starvation(const rank_view& v, double tolerance_ms, verdict& out) {
  const auto tolerance_ns = static_cast<std::uint64_t>(std::max(0.0, tolerance_ms) * 1e6);
  const auto found = find_starvation(v.rt.trace, tolerance_ns);
  if (found.first) {
    out.offer("starvation", v.rt.rank, found.first->at_ns,
              fmt::format("rank {} at {:.6f} s: {}", v.rt.rank, seconds(found.first->at_ns), found.first->what));
    return;
  }
  out.result.checked.push_back(fmt::format(
      "starvation (rank {}): {} forward/backward spans of {} stages, each started within {} ms of becoming "
      "runnable (the longest wait {:.3f} ms{})",
      v.rt.rank, found.spans, found.stages, tolerance_ms, static_cast<double>(found.longest_ns) * 1e-6,
      found.longest.empty() ? "" : ", " + found.longest));
}

// A torn trace is not a consistent cut: the writer drains the recorder's
// per-thread buffers one after the other, and a kill can tear the last batch of
// frames, so records up to about one drain interval before the last one kept
// may be missing while later ones are there. Such a trace is checked only up to
// its last record less twice the writer's interval (info "trace_interval_ms",
// 1000 when absent); spans count by their end, when they were recorded.
rank_trace checked_part(const rank_trace& rt, std::vector<std::string>& notes) {
  if (rt.trace.end.closed || rt.trace.records.empty()) return rt;
  std::uint64_t interval_ms = 1000;
  try {
    if (const auto v = rt.trace.info_value("trace_interval_ms"); !v.empty()) interval_ms = std::stoull(v);
  } catch (const std::exception&) {
    // The default interval then.
  }
  std::uint64_t last = 0;
  for (const auto& r : rt.trace.records) last = std::max(last, std::max(r.t0_ns, r.t1_ns));
  const std::uint64_t margin = 2 * interval_ms * 1'000'000ull;
  const std::uint64_t safe = last > margin ? last - margin : 0;
  rank_trace part{rt.rank, rt.path, {}};
  part.trace.names = rt.trace.names;
  part.trace.actors = rt.trace.actors;
  part.trace.version = rt.trace.version;
  part.trace.info = rt.trace.info;
  part.trace.end = rt.trace.end;
  for (const auto& r : rt.trace.records)
    if ((r.kind == static_cast<std::uint8_t>(trace_kind::span) ? r.t1_ns : r.t0_ns) <= safe)
      part.trace.records.push_back(r);
  notes.push_back(fmt::format("rank {}: torn trace ({}): checked up to {:.6f} s, its last record at {:.6f} s less "
                              "twice the writer's {} ms interval ({} of {} records)",
                              rt.rank, rt.trace.end.why, seconds(safe), seconds(last), interval_ms,
                              part.trace.records.size(), rt.trace.records.size()));
  return part;
}

} // namespace

trace_check_result check_traces(const std::vector<rank_trace>& traces, const trace_check_options& options) {
  verdict out;
  std::vector<rank_trace> parts;
  parts.reserve(traces.size());
  for (const auto& t : traces) parts.push_back(checked_part(t, out.result.checked));
  std::vector<rank_view> views;
  views.reserve(parts.size());
  for (const auto& t : parts) views.emplace_back(t);
  for (const auto& v : views) {
    check_slots(v, out);
    check_sequence(v, out);
    check_delivery(v, out);
    check_starvation(v, options.idle_tolerance_ms, out);
  }
  check_collectives(views, out);
  return std::move(out.result);
}

std::string format_trace_check(const trace_check_result& r) {
  std::string out;
  if (r.first)
    out += fmt::format("FAILED: first violation ({} check), rank {} at {:.6f} s:\n  {}\n", r.first->check,
                       r.first->rank, r.first->time_s, r.first->what);
  out += r.first ? "checks without a violation:\n" : "checked:\n";
  for (const auto& c : r.checked) out += "  " + c + "\n";
  if (!r.outstanding.empty()) {
    out += "torn trace: still outstanding at the cut (not violations)\n";
    for (const auto& o : r.outstanding) out += "  " + o + "\n";
  }
  if (!r.first) out += "OK: no violation\n";
  return out;
}

} // namespace dsa::actors
