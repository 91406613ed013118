// Export of a trace to Chrome trace-event JSON (opens in Perfetto and
// chrome://tracing): spans as "X" events with stage, step and micro_batch in
// args; messages as instant events plus flow arrows ("s"/"f") from send to
// receive; one track (tid) per actor, named by "M" metadata events.
#pragma once

#include "actors/trace/trace_recorder.hpp"
#include "core/error.hpp"

#include <string>

namespace dsa::actors {

std::string chrome_trace_json(const trace_data& trace);
status write_chrome_trace(const std::string& path, const trace_data& trace);

} // namespace dsa::actors
