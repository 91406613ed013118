// The plan's edges as a trace's info frame lists them: "edge.<id>" = "<slots>
// <name>" (actors/run.cpp). Traces written before the plan went in lack them.
#pragma once

#include "actors/trace/trace_recorder.hpp"

#include <cstdint>
#include <map>
#include <string>

namespace dsa::actors {

struct trace_edge {
  std::string name;        // "activation 0", "" when the entry names none
  std::uint32_t slots = 0; // 0: unknown
};

// By edge id; malformed entries are left out (they only cost the slot bound).
std::map<std::uint32_t, trace_edge> trace_edges(const trace_data& trace);

// "edge 2 (activation 0)", or "edge 2" when the edge has no name.
std::string trace_edge_label(const std::map<std::uint32_t, trace_edge>& edges, std::uint32_t id);

} // namespace dsa::actors
