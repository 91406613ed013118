// Export of traces to Chrome trace-event JSON (opens in Perfetto and
// chrome://tracing): a process per rank, a track (tid) per actor named by "M"
// metadata events; spans as "X" events with stage, step and micro_batch in
// args (category "comm" for the gradient allreduces, "compute" for the rest,
// "io" for I/O); the NVMe swap's I/O spans on a row of their own per actor ("<actor>
// nvme"); messages as instant events plus flow arrows ("s"/"f") from send to
// receive; and per edge a counter of its slots in use (and free, where the
// trace lists the plan's slot counts), stepped at each produce and release the
// producer saw. Each rank keeps its own clock (from its recorder's origin).
#pragma once

#include "actors/trace/trace_recorder.hpp"
#include "actors/trace/analysis/trace_summary.hpp"
#include "core/error.hpp"

#include <string>
#include <vector>

namespace dsa::actors {

std::string chrome_trace_json(const std::vector<rank_trace>& traces);
// One trace, as rank 0 (what `dsactor run --trace-chrome` writes).
std::string chrome_trace_json(const trace_data& trace);
status write_chrome_trace(const std::string& path, const std::vector<rank_trace>& traces);
status write_chrome_trace(const std::string& path, const trace_data& trace);

// `s` as a JSON string literal, quotes included; '<' is escaped too, so the
// literal may stand inside an HTML <script> element.
std::string json_quoted(const std::string& s);

} // namespace dsa::actors
