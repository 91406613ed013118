// Several processes' traces on one clock; see trace_clock.hpp.
#include "actors/trace/trace_clock.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <optional>

namespace dsa::actors {

namespace {
std::optional<std::uint64_t> info_u64(const trace_data& t, const char* key) {
  const std::string v = t.info_value(key);
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 19) return std::nullopt;
  return std::stoull(v);
}

// Offsets from origins on one clock: each origin minus the earliest.
std::vector<std::uint64_t> from_origins(const std::vector<std::uint64_t>& origins) {
  const std::uint64_t first = *std::min_element(origins.begin(), origins.end());
  std::vector<std::uint64_t> out;
  for (std::uint64_t o : origins) out.push_back(o - first);
  return out;
}
} // namespace

std::string current_boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

trace_clocks align_trace_clocks(const std::vector<rank_trace>& traces) {
  trace_clocks c;
  c.offset_ns.assign(traces.size(), 0);
  if (traces.size() < 2) {
    c.how = "one trace: its own clock";
    return c;
  }
  std::vector<std::uint64_t> steady, unix_ns;
  std::string boot = traces.front().trace.info_value("boot_id");
  bool one_boot = !boot.empty();
  for (const auto& rt : traces) {
    const auto s = info_u64(rt.trace, "origin_steady_ns");
    const auto u = info_u64(rt.trace, "origin_unix_ns");
    if (s) steady.push_back(*s);
    if (u) unix_ns.push_back(*u);
    one_boot = one_boot && s && rt.trace.info_value("boot_id") == boot;
  }
  if (one_boot) {
    c.offset_ns = from_origins(steady);
    c.how = fmt::format("{} ranks of one host (boot {}) on the steady clock they share: offsets exact",
                        traces.size(), boot.substr(0, 8));
  } else if (unix_ns.size() == traces.size()) {
    c.offset_ns = from_origins(unix_ns);
    c.how = fmt::format("{} ranks on their hosts' system clocks: offsets as close as the hosts' clock "
                        "synchronisation keeps them",
                        traces.size());
  } else {
    c.how = fmt::format("{} ranks each from its own origin (a trace without its origin's clock time)", traces.size());
  }
  return c;
}

} // namespace dsa::actors
