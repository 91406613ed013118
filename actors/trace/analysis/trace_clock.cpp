// Several processes' traces on one clock; see trace_clock.hpp.
#include "actors/trace/analysis/trace_clock.hpp"

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

std::optional<std::int64_t> info_i64(const trace_data& t, const char* key) {
  std::string v = t.info_value(key);
  const bool negative = !v.empty() && v[0] == '-';
  if (negative) v.erase(0, 1);
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 18) return std::nullopt;
  const auto n = static_cast<std::int64_t>(std::stoll(v));
  return negative ? -n : n;
}

// Offsets from origins on one clock: each origin minus the earliest.
std::vector<std::uint64_t> from_origins(const std::vector<std::uint64_t>& origins) {
  const std::uint64_t first = *std::min_element(origins.begin(), origins.end());
  std::vector<std::uint64_t> out;
  for (std::uint64_t o : origins) out.push_back(o - first);
  return out;
}
} // namespace

trace_data shifted_trace(trace_data t, std::uint64_t offset_ns) {
  for (auto& r : t.records) {
    r.t0_ns += offset_ns;
    if (r.kind == static_cast<std::uint8_t>(trace_kind::span)) r.t1_ns += offset_ns;
  }
  return t;
}

trace_clocks align_trace_clocks(const std::vector<rank_trace>& traces) {
  trace_clocks c;
  c.offset_ns.assign(traces.size(), 0);
  if (traces.size() < 2) {
    c.how = "one trace: its own clock";
    return c;
  }
  std::vector<std::uint64_t> steady, unix_ns, on_reference;
  std::string boot = traces.front().trace.info_value("boot_id");
  const std::string reference = traces.front().trace.info_value("clock_reference");
  bool one_boot = !boot.empty();
  std::uint64_t worst_error = 0;
  std::vector<std::string> boots;
  std::vector<std::int64_t> estimates; // clock_reference_offset_ns, per trace that has one
  std::vector<std::uint64_t> errors;
  for (const auto& rt : traces) {
    const auto s = info_u64(rt.trace, "origin_steady_ns");
    const auto u = info_u64(rt.trace, "origin_unix_ns");
    if (s) steady.push_back(*s);
    if (u) unix_ns.push_back(*u);
    one_boot = one_boot && s && rt.trace.info_value("boot_id") == boot;
    if (std::find(boots.begin(), boots.end(), rt.trace.info_value("boot_id")) == boots.end())
      boots.push_back(rt.trace.info_value("boot_id"));
    // The origin on the rendezvous server's steady clock: origin + offset (trainer.cpp).
    const auto offset = info_i64(rt.trace, "clock_reference_offset_ns");
    const auto error = info_u64(rt.trace, "clock_reference_error_ns");
    if (s && offset && error && !reference.empty() && rt.trace.info_value("clock_reference") == reference) {
      on_reference.push_back(*s + static_cast<std::uint64_t>(*offset));
      worst_error = std::max(worst_error, *error);
      estimates.push_back(*offset);
      errors.push_back(*error);
    }
  }
  if (one_boot) {
    c.offset_ns = from_origins(steady);
    c.how = fmt::format("{} ranks of one host (boot {}) on the steady clock they share: offsets exact",
                        traces.size(), boot.substr(0, 8));
    if (on_reference.size() == traces.size()) {
      // Sharing one clock, the ranks' estimates of the server's must agree within the sum
      // of their error bounds: a check of the estimation on every multi-process run.
      std::int64_t worst_gap = 0;
      bool within = true;
      for (std::size_t i = 1; i < estimates.size(); ++i) {
        const std::int64_t gap = estimates[i] > estimates[0] ? estimates[i] - estimates[0] : estimates[0] - estimates[i];
        worst_gap = std::max(worst_gap, gap);
        within = within && static_cast<std::uint64_t>(gap) <= errors[i] + errors[0];
      }
      c.how += fmt::format("; the rendezvous clock estimates {} to within {:.1f} us (bound +/-{:.1f} us)",
                           within ? "agree" : "DISAGREE", static_cast<double>(worst_gap) * 1e-3,
                           2 * static_cast<double>(worst_error) * 1e-3);
    }
  } else if (on_reference.size() == traces.size()) {
    c.offset_ns = from_origins(on_reference);
    c.how = fmt::format("{} ranks on {} hosts, on the steady clock of the {}: offsets estimated at rendezvous, "
                        "each within +/-{:.1f} us (two ranks within +/-{:.1f} us of each other)",
                        traces.size(), boots.size(), reference, static_cast<double>(worst_error) * 1e-3,
                        2 * static_cast<double>(worst_error) * 1e-3);
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
