// Edges from a trace's info frame; see trace_edges.hpp.
#include "actors/trace/analysis/trace_edges.hpp"

#include <fmt/format.h>

#include <exception>

namespace dsa::actors {

std::map<std::uint32_t, trace_edge> trace_edges(const trace_data& trace) {
  std::map<std::uint32_t, trace_edge> edges;
  for (const auto& [key, value] : trace.info) {
    if (key.rfind("edge.", 0) != 0) continue;
    try {
      const auto id = static_cast<std::uint32_t>(std::stoul(key.substr(5)));
      const auto space = value.find(' ');
      edges[id] = trace_edge{space == std::string::npos ? "" : value.substr(space + 1),
                             static_cast<std::uint32_t>(std::stoul(value.substr(0, space)))};
    } catch (const std::exception&) {
      // std::stoul on a malformed entry: leave the edge out.
    }
  }
  return edges;
}

std::string trace_edge_label(const std::map<std::uint32_t, trace_edge>& edges, std::uint32_t id) {
  auto it = edges.find(id);
  return it == edges.end() || it->second.name.empty() ? fmt::format("edge {}", id)
                                                      : fmt::format("edge {} ({})", id, it->second.name);
}

} // namespace dsa::actors
