// Merging the processes of a pipeline's replica into one trace; see trace_join.hpp.
#include "actors/trace/analysis/trace_join.hpp"

#include "actors/trace/analysis/trace_clock.hpp"
#include "actors/trace/trace_recorder.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string>

namespace dsa::actors {

std::vector<rank_trace> join_pipeline_processes(std::vector<rank_trace> traces) {
  bool any = false;
  for (const auto& t : traces) any = any || !t.trace.info_value("placement").empty();
  if (!any) return traces;
  const trace_clocks clocks = align_trace_clocks(traces);
  std::map<std::uint32_t, std::vector<std::size_t>> replicas; // replica -> indices, in rank order
  std::vector<rank_trace> out, rest;
  for (std::size_t i = 0; i < traces.size(); ++i) {
    const auto& t = traces[i].trace;
    if (t.info_value("placement").empty()) continue;
    replicas[static_cast<std::uint32_t>(std::stoul("0" + t.info_value("replica")))].push_back(i);
  }
  for (const auto& [replica, members] : replicas) {
    // The earliest origin stays the merged trace's: the others' times move onto it.
    std::size_t base = members.front();
    for (std::size_t i : members)
      if (clocks.offset_ns[i] < clocks.offset_ns[base]) base = i;
    rank_trace merged;
    merged.rank = replica;
    merged.trace.names = traces[base].trace.names;
    merged.trace.actors = traces[base].trace.actors;
    merged.trace.version = traces[base].trace.version;
    merged.trace.end = trace_end{};
    merged.trace.info = traces[base].trace.info;
    std::string ranks;
    for (std::size_t i : members) {
      const auto& t = traces[i].trace;
      merged.path += (merged.path.empty() ? "" : " + ") + traces[i].path;
      ranks += (ranks.empty() ? "" : ",") + std::to_string(traces[i].rank);
      if (t.actors.size() > merged.trace.actors.size()) merged.trace.actors = t.actors;
      // Name indices differ per file: map this file's onto the merged table.
      std::vector<std::uint16_t> name_of(t.names.size());
      for (std::size_t n = 0; n < t.names.size(); ++n) {
        auto it = std::find(merged.trace.names.begin(), merged.trace.names.end(), t.names[n]);
        if (it == merged.trace.names.end()) it = merged.trace.names.insert(merged.trace.names.end(), t.names[n]);
        name_of[n] = static_cast<std::uint16_t>(it - merged.trace.names.begin());
      }
      const std::uint64_t shift = clocks.offset_ns[i] - clocks.offset_ns[base];
      for (auto r : t.records) {
        r.t0_ns += shift;
        if (r.kind == static_cast<std::uint8_t>(trace_kind::span)) r.t1_ns += shift;
        if (r.name < name_of.size()) r.name = name_of[r.name];
        merged.trace.records.push_back(r);
      }
      // The merged size is the files' sum; a torn file makes the whole one torn, named.
      if (!merged.trace.end.closed) continue;
      if (t.end.closed) {
        merged.trace.end.valid_bytes += t.end.valid_bytes;
        merged.trace.end.file_bytes += t.end.file_bytes;
      } else {
        merged.trace.end = t.end;
        merged.trace.end.why = fmt::format("{}: {}", traces[i].path, t.end.why);
      }
    }
    for (auto& [key, value] : merged.trace.info) {
      if (key == "rank") value = std::to_string(replica);
      // "edge.<id>" = "<slots> <name>": a process plans another's grads edge with one slot
      // (it does not know that stage's buckets); the owner's count is the largest.
      if (key.rfind("edge.", 0) == 0)
        for (std::size_t i : members) {
          const std::string other = traces[i].trace.info_value(key);
          const auto slots = [](const std::string& v) { return std::stoul("0" + v.substr(0, v.find(' '))); };
          if (!other.empty() && slots(other) > slots(value)) value = other;
        }
    }
    merged.trace.info.emplace_back("processes", ranks);
    sort_trace_records(merged.trace.records);
    out.push_back(std::move(merged));
  }
  for (auto& t : traces)
    if (t.trace.info_value("placement").empty()) out.push_back(std::move(t));
  return out;
}

} // namespace dsa::actors
