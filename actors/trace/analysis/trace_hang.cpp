// Where a hang began, from the processes' flight records; see trace_hang.hpp.
#include "actors/trace/analysis/trace_hang.hpp"

#include "actors/data_parallel.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace dsa::actors {

namespace {

using net::flight_call;

std::string ranks_text(const std::vector<std::int32_t>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i)
    out += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  return out;
}

std::string rank_list(const std::vector<std::int32_t>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + ranks_text(ranks);
}

std::string call_name(const flight_call& c) {
  return fmt::format("{} #{} ({} bytes of {})", net::op_kind_name(c.kind), c.seq, c.bytes, dtype_name(c.type));
}

double seconds(std::uint64_t ns) { return static_cast<double>(ns) * 1e-9; }

// How long a call was (or is) in progress at its record's time.
double waited(const flight_call& c, std::uint64_t at_ns) {
  const std::uint64_t end = c.outcome == flight_call::state::running ? at_ns : c.end_ns;
  return end > c.start_ns ? seconds(end - c.start_ns) : 0.0;
}

struct member_calls {
  const hang_input* in = nullptr;
  std::map<std::uint64_t, const flight_call*> by_seq;
};

// What a call's ranks must agree on: kind, dtype and count.
std::string call_signature(const flight_call& c) {
  return fmt::format("{} of {} {}", net::op_kind_name(c.kind), c.count, dtype_name(c.type));
}

// The call rank r is waiting in outside (channel, group), if any: r is then a victim there.
const flight_call* waiting_elsewhere(const hang_input& in, std::uint32_t channel, const std::vector<std::int32_t>& group) {
  const flight_call* found = nullptr;
  for (const auto& c : in.record.calls)
    if (c.outcome != flight_call::state::done && !(c.channel == channel && c.group == group) &&
        (!found || c.start_ns < found->start_ns))
      found = &c;
  return found;
}

// The first call of one group that some member did not finish, if any.
std::optional<hang_finding> diverged(std::uint32_t channel, const std::vector<std::int32_t>& group,
                                     const std::map<std::int32_t, member_calls>& members) {
  std::uint64_t lo = 0, hi = 0;
  bool any = false;
  for (const auto& [rank, m] : members) {
    if (m.by_seq.empty()) continue;
    lo = any ? std::max(lo, m.by_seq.begin()->first) : m.by_seq.begin()->first; // older calls may be gone from a ring
    hi = any ? std::max(hi, m.by_seq.rbegin()->first) : m.by_seq.rbegin()->first;
    any = true;
  }
  if (!any) return std::nullopt;
  for (std::uint64_t s = lo; s <= hi; ++s) {
    bool all_done = true;
    std::vector<std::int32_t> absent, present;
    for (std::int32_t r : group) {
      auto it = members.find(r);
      if (it == members.end()) continue; // no record from it: listed apart
      auto c = it->second.by_seq.find(s);
      if (c == it->second.by_seq.end()) {
        absent.push_back(r);
        all_done = false;
        continue;
      }
      present.push_back(r);
      if (c->second->outcome != flight_call::state::done) all_done = false;
    }
    if (all_done) continue;
    hang_finding f;
    f.channel = channel;
    f.group = group;
    f.seq = s;
    std::set<std::string> kinds;
    for (std::int32_t r : present) {
      const auto& m = members.at(r);
      const flight_call& c = *m.by_seq.at(s);
      kinds.insert(call_signature(c));
      if (f.op.empty()) {
        f.op = net::op_kind_name(c.kind);
        f.bytes = c.bytes;
      }
      const double w = waited(c, m.in->record.at_ns);
      f.waited_s = std::max(f.waited_s, w);
      const char* how = c.outcome == flight_call::state::done     ? "finished it after"
                        : c.outcome == flight_call::state::failed ? "waited in it, then failed when the job stopped, after"
                                                                  : "is still waiting in it after";
      f.lines.push_back(fmt::format("rank {} entered {} and {} {:.2f} s", r, call_name(c), how, w));
    }
    std::vector<std::int32_t> free_absent; // absent ranks that wait in no other call
    for (std::int32_t r : absent) {
      const auto& m = members.at(r);
      if (const flight_call* other = waiting_elsewhere(*m.in, channel, group)) {
        f.victims.push_back(r);
        f.lines.push_back(fmt::format("rank {} never entered #{}: it is itself waiting in {} on channel {} ({}) "
                                      "for {:.2f} s",
                                      r, s, call_name(*other), other->channel, channel_role(other->channel),
                                      waited(*other, m.in->record.at_ns)));
        continue;
      }
      free_absent.push_back(r);
      auto later = m.by_seq.upper_bound(s);
      if (later != m.by_seq.end())
        f.lines.push_back(fmt::format("rank {} never entered #{}: it skipped it and went on to {}", r, s,
                                      call_name(*later->second)));
      else if (!m.by_seq.empty())
        f.lines.push_back(fmt::format("rank {} never entered #{}: its last call here was {}, {}", r, s,
                                      call_name(*m.by_seq.rbegin()->second),
                                      m.by_seq.rbegin()->second->outcome == flight_call::state::done ? "finished"
                                                                                                     : "not finished"));
      else
        f.lines.push_back(fmt::format("rank {} never entered #{}: it made no call in this group", r, s));
    }
    std::vector<std::int32_t> unrecorded; // members that wrote no record: lost, or killed first
    for (std::int32_t r : group)
      if (!members.count(r)) unrecorded.push_back(r);
    const std::string where = fmt::format("{} #{} on channel {} ({}, world {})", f.op.empty() ? "collective" : f.op, s,
                                          channel, channel_role(channel), rank_list(group));
    if (!absent.empty()) {
      f.root = !free_absent.empty();
      f.culprits = f.root ? free_absent : absent;
      f.verdict = fmt::format("{} never entered {}; {} waited up to {:.2f} s in it{}", rank_list(f.culprits), where,
                              present.empty() ? "no rank" : rank_list(present), f.waited_s,
                              f.root && !f.victims.empty()
                                  ? fmt::format(" ({} did not enter it either, waiting in another call)",
                                                rank_list(f.victims))
                                  : "");
    } else if (kinds.size() > 1) {
      f.culprits = present;
      std::string issued;
      for (std::int32_t r : present)
        issued += fmt::format("{}rank {} issued {}", issued.empty() ? "" : ", ", r,
                              call_signature(*members.at(r).by_seq.at(s)));
      f.verdict = fmt::format("the ranks issued different collectives as call #{} on channel {}: {}", s, channel, issued);
    } else if (!unrecorded.empty()) {
      f.culprits = unrecorded;
      f.verdict = fmt::format("{} wrote no flight record (lost, or killed before it could); {} waited up to {:.2f} s "
                              "for {} in {}",
                              rank_list(unrecorded), rank_list(present), f.waited_s,
                              unrecorded.size() == 1 ? "it" : "them", where);
    } else {
      std::vector<std::int32_t> waiting;
      for (std::int32_t r : present)
        if (members.at(r).by_seq.at(s)->outcome != flight_call::state::done) waiting.push_back(r);
      f.culprits = waiting;
      f.verdict = fmt::format("every rank entered {}; {} did not get out of it (up to {:.2f} s): a message between "
                              "them did not arrive",
                              where, rank_list(waiting), f.waited_s);
    }
    return f;
  }
  return std::nullopt;
}

} // namespace

std::string channel_role(std::uint32_t channel) {
  if (channel == hook_channel) return "the step hooks";
  if (channel >= (1u << 21)) return fmt::format("ZeRO-3 gradient partition of stage {}", channel - (1u << 21));
  if (channel >= (1u << 20)) return fmt::format("ZeRO-3 parameter fetcher of stage {}", channel - (1u << 20));
  if (channel % 2 == 1) return fmt::format("gradient reducer of stage {}", (channel - 1) / 2);
  return fmt::format("optimizer shards of stage {}", (channel - 2) / 2);
}

expected<std::vector<hang_input>> hang_inputs(const std::vector<rank_trace>& traces, bool last) {
  std::vector<hang_input> out;
  std::vector<std::string> problems;
  for (const auto& t : traces) {
    if (t.trace.flights.empty()) continue;
    // Every record read once: the chosen one for the analysis, each one's reason for the list.
    std::vector<expected<net::flight_record>> all;
    for (const auto& f : t.trace.flights) all.push_back(net::decode_flight(f));
    auto& record = last ? all.back() : all.front();
    if (!record) {
      problems.push_back(fmt::format("{}: {}", t.path, record.err().message));
      hang_input bad;
      bad.rank = static_cast<std::int32_t>(t.rank);
      bad.path = t.path;
      bad.records = t.trace.flights.size();
      bad.problem = record.err().message;
      out.push_back(std::move(bad));
      continue;
    }
    hang_input in;
    in.rank = record->rank >= 0 ? record->rank : static_cast<std::int32_t>(t.rank);
    in.path = t.path;
    in.records = t.trace.flights.size();
    in.last = last;
    if (in.records > 1)
      for (const auto& each : all)
        in.reasons.push_back(!each ? "(does not read)" : each->reason.empty() ? "(no reason given)" : each->reason);
    in.record = std::move(*record);
    out.push_back(std::move(in));
  }
  if (std::all_of(out.begin(), out.end(), [](const hang_input& in) { return !in.problem.empty(); }))
    return make_error(errc::not_found,
                      "no flight record in {} trace file(s){}: a process writes one on the watchdog, a lost peer, "
                      "SIGUSR1 or a stop signal (kill -USR1 PID while a run hangs)",
                      traces.size(), problems.empty() ? "" : " (" + problems.front() + ")");
  std::sort(out.begin(), out.end(), [](const hang_input& a, const hang_input& b) { return a.rank < b.rank; });
  return out;
}

hang_report analyse_hang(const std::vector<hang_input>& inputs) {
  hang_report report;
  std::map<std::int32_t, const hang_input*> by_rank;
  for (const auto& in : inputs) {
    if (!in.problem.empty()) {
      report.records.push_back(fmt::format("rank {}: its flight record does not read ({}), in {}; left out", in.rank,
                                           in.problem, in.path));
      continue;
    }
    by_rank[in.rank] = &in;
    report.records.push_back(fmt::format("rank {}: {} ({} call(s) held{}{}), in {}", in.rank,
                                         in.record.reason.empty() ? "no reason given" : in.record.reason,
                                         in.record.calls.size(),
                                         in.record.calls_dropped ? fmt::format(", {} older dropped", in.record.calls_dropped)
                                                                 : "",
                                         in.records > 1 ? fmt::format("; the {} of {} records", in.last ? "last" : "first",
                                                                      in.records)
                                                        : "",
                                         in.path));
    if (!in.reasons.empty()) {
      std::string list;
      for (std::size_t i = 0; i < in.reasons.size(); ++i)
        list += fmt::format("{}{}. {}", i ? "; " : "", i + 1, in.reasons[i]);
      report.records.push_back(fmt::format("  its records in the order written: {}", list));
    }
  }
  // Collectives by group: (channel, world ranks).
  std::map<std::pair<std::uint32_t, std::vector<std::int32_t>>, std::map<std::int32_t, member_calls>> groups;
  for (const auto& in : inputs)
    for (const auto& c : in.record.calls) { // (a record that did not read has none)
      auto& m = groups[{c.channel, c.group}][in.rank];
      m.in = &in;
      m.by_seq[c.seq] = &c;
    }
  for (auto& [key, members] : groups) {
    // Members with a record but no call in this group still count (they never entered it).
    for (std::int32_t r : key.second)
      if (!members.count(r) && by_rank.count(r)) members[r].in = by_rank.at(r);
    if (auto f = diverged(key.first, key.second, members)) {
      for (std::int32_t r : key.second)
        if (!by_rank.count(r)) f->lines.push_back(fmt::format("rank {} wrote no flight record (killed first?)", r));
      report.findings.push_back(std::move(*f));
    }
  }
  // Where a chain of waits ends first (a culprit waiting in nothing else),
  // Fewest victims among them (the cleanest view of the cause), then the longest wait.
  std::stable_sort(report.findings.begin(), report.findings.end(), [](const hang_finding& a, const hang_finding& b) {
    if (a.root != b.root) return a.root;
    if (a.victims.size() != b.victims.size()) return a.victims.size() < b.victims.size();
    return a.waited_s > b.waited_s;
  });
  // Pipeline edges: what each side counted.
  std::map<std::tuple<std::uint32_t, std::int32_t, std::int32_t>, hang_edge> edges;
  for (const auto& in : inputs)
    for (const auto& e : in.record.edges) {
      if (e.sent > 0) {
        auto& h = edges[{e.edge, in.rank, e.peer}];
        h.edge = e.edge, h.from = in.rank, h.to = e.peer, h.sent = e.sent, h.sender_recorded = true;
        h.last_sent_step = e.last_sent_step, h.last_sent_micro = e.last_sent_micro;
      }
      if (e.received > 0 || e.credits_sent > 0) { // this rank consumes the edge
        auto& h = edges[{e.edge, e.peer, in.rank}];
        h.edge = e.edge, h.from = e.peer, h.to = in.rank, h.received = e.received, h.receiver_recorded = true;
        h.last_received_step = e.last_received_step, h.last_received_micro = e.last_received_micro;
        h.credits_returned = e.credits_sent;
      }
      if (e.credits_received > 0) { // this rank produces it and got slots back
        auto& h = edges[{e.edge, in.rank, e.peer}];
        h.edge = e.edge, h.from = in.rank, h.to = e.peer, h.credits_back = e.credits_received;
      }
    }
  for (auto& [key, h] : edges) {
    const bool both = by_rank.count(h.from) && by_rank.count(h.to);
    if (!both)
      h.line = fmt::format("edge {} rank {} -> rank {}: {} sent, {} received (rank {} wrote no record)", h.edge, h.from,
                           h.to, h.sent, h.received, by_rank.count(h.from) ? h.to : h.from);
    else if (h.sent == h.received)
      h.line = fmt::format("edge {} rank {} -> rank {}: {} sent, all received", h.edge, h.from, h.to, h.sent);
    else
      h.line = fmt::format("edge {} rank {} -> rank {}: {} sent (the last of step {} micro-batch {}), {} received (the "
                           "last of step {} micro-batch {}): {}",
                           h.edge, h.from, h.to, h.sent, h.last_sent_step, h.last_sent_micro, h.received,
                           h.last_received_step, h.last_received_micro,
                           h.sent > h.received ? fmt::format("{} in flight or lost, as far as records taken at "
                                                             "different moments tell",
                                                             h.sent - h.received)
                                               : std::string("the receiver's record was taken later"));
    // The credits: a slot given back that never reached the producer leaves it waiting for
    // a free slot (back-pressure with nothing behind it).
    if (both && h.credits_returned == h.credits_back)
      h.line += fmt::format("; {} slot(s) given back, all back at rank {}", h.credits_returned, h.from);
    else if (both)
      h.line += fmt::format("; {} slot(s) given back by rank {}, {} back at rank {}: {}", h.credits_returned, h.to,
                            h.credits_back, h.from,
                            h.credits_returned > h.credits_back
                                ? fmt::format("{} credit(s) in flight or lost", h.credits_returned - h.credits_back)
                                : std::string("the producer's record was taken later"));
    report.edges.push_back(h);
  }
  if (!report.findings.empty())
    report.verdict = report.findings.front().verdict;
  else if (std::any_of(report.edges.begin(), report.edges.end(),
                       [](const hang_edge& e) { return e.sent > e.received; }))
    report.verdict = "every collective the records hold finished; a pipeline edge has messages in flight (above; a job "
                     "still running always has some: a hang keeps the counts apart in a later record too)";
  else if (std::any_of(report.edges.begin(), report.edges.end(),
                       [](const hang_edge& e) { return e.credits_returned > e.credits_back; }))
    report.verdict = "every collective the records hold finished and every pipeline message arrived; a pipeline "
                     "edge has slots given back that its producer has not got (credits in flight or lost, above; a "
                     "job still running always has some: a hang keeps the counts apart in a later record too)";
  else
    report.verdict = "the records agree: every collective they hold finished on every rank and every pipeline message "
                     "arrived (the hang, if any, is elsewhere: a stage's own work, or a call older than the records)";
  return report;
}

std::string format_hang(const hang_report& r) {
  std::string out = "flight records:\n";
  for (const auto& line : r.records) out += "  " + line + "\n";
  if (!r.findings.empty()) {
    out += "collectives where the ranks diverged (longest wait first):\n";
    for (const auto& f : r.findings) {
      out += fmt::format("  channel {} ({}), world {}: call #{}\n", f.channel, channel_role(f.channel),
                         rank_list(f.group), f.seq);
      for (const auto& line : f.lines) out += "    " + line + "\n";
    }
  }
  if (!r.edges.empty()) {
    out += "pipeline edges between processes:\n";
    for (const auto& e : r.edges) out += "  " + e.line + "\n";
  }
  out += "verdict: " + r.verdict + "\n";
  return out;
}

} // namespace dsa::actors
