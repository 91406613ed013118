// The summary's swap I/O section; see trace_swap_io.hpp.
#include "actors/trace/analysis/trace_swap_io.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace dsa::actors {

namespace {

using interval = std::pair<std::uint64_t, std::uint64_t>;

// The intervals as sorted, disjoint ones.
std::vector<interval> merged(std::vector<interval> xs) {
  std::sort(xs.begin(), xs.end());
  std::vector<interval> out;
  for (const auto& x : xs) {
    if (!out.empty() && x.first <= out.back().second)
      out.back().second = std::max(out.back().second, x.second);
    else
      out.push_back(x);
  }
  return out;
}

double length_s(const std::vector<interval>& disjoint) {
  std::uint64_t n = 0;
  for (const auto& [a, b] : disjoint)
    n += b - a;
  return static_cast<double>(n) * 1e-9;
}

// Length of the intersection of two sorted, disjoint lists, in seconds.
double common_s(const std::vector<interval>& a, const std::vector<interval>& b) {
  std::uint64_t n = 0;
  for (std::size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    const std::uint64_t lo = std::max(a[i].first, b[j].first),
                        hi = std::min(a[i].second, b[j].second);
    if (lo < hi)
      n += hi - lo;
    (a[i].second < b[j].second ? i : j)++;
  }
  return static_cast<double>(n) * 1e-9;
}

int name_index(const trace_data& t, const char* name) {
  for (std::size_t i = 0; i < t.names.size(); ++i)
    if (t.names[i] == name)
      return static_cast<int>(i);
  return -1;
}

} // namespace

std::vector<swap_io_step> summarize_swap_io(const std::vector<rank_trace>& traces) {
  std::vector<swap_io_step> out;
  for (const auto& rt : traces) {
    const auto& t = rt.trace;
    const int read = name_index(t, "swap_read"), write = name_index(t, "swap_write");
    const int forward = name_index(t, "forward"), backward = name_index(t, "backward");
    const int optimizer = name_index(t, "optimizer"), chunk_update = name_index(t, "swap_update");
    if (read < 0 && write < 0)
      continue; // a trace from before the swap spans
    std::vector<interval> compute, updates;
    std::vector<std::uint32_t> updated; // steps with an optimizer span
    struct step_spans {
      swap_io_step s;
      std::vector<interval> transfers, reads, updates;
    };
    std::map<std::uint32_t, step_spans> steps;
    for (const auto& r : t.records) {
      if (r.kind != static_cast<std::uint8_t>(trace_kind::span))
        continue;
      const int n = r.name;
      if (n == forward || n == backward)
        compute.emplace_back(r.t0_ns, r.t1_ns);
      else if (n == optimizer) {
        updates.emplace_back(r.t0_ns, r.t1_ns);
        updated.push_back(r.step);
      }
      if (n == chunk_update)
        steps[r.step].updates.emplace_back(r.t0_ns, r.t1_ns);
      if (n != read && n != write)
        continue;
      auto& entry = steps[r.step];
      auto& s = entry.s;
      s.rank = rt.rank;
      s.step = r.step;
      (n == read ? s.bytes_read : s.bytes_written) += r.bytes;
      ++(n == read ? s.reads : s.writes);
      entry.transfers.emplace_back(r.t0_ns, r.t1_ns);
      if (n == read)
        entry.reads.emplace_back(r.t0_ns, r.t1_ns);
    }
    compute = merged(std::move(compute));
    updates = merged(std::move(updates));
    for (auto& [step, entry] : steps) {
      auto& s = entry.s;
      if (entry.transfers.empty())
        continue;
      const auto busy = merged(std::move(entry.transfers));
      const auto reading = merged(std::move(entry.reads));
      s.read_s = length_s(reading);
      s.reads_during_update_s = common_s(reading, merged(std::move(entry.updates)));
      s.busy_s = length_s(busy);
      s.during_compute_s = common_s(busy, compute);
      s.inside_optimizer_s = common_s(busy, updates);
      s.updated = std::find(updated.begin(), updated.end(), step) != updated.end();
      out.push_back(s);
    }
  }
  return out;
}

std::string format_swap_io(const std::vector<swap_io_step>& steps) {
  if (steps.empty())
    return {};
  std::string out = "\nNVMe swap I/O per step (optimizer state; busy: a transfer in flight; the "
                    "shares of busy time "
                    "during a forward/backward span and inside an optimizer span may overlap; "
                    "read/upd: of the reading time, the share while another chunk was updated)\n";
  out += fmt::format("  {:>4} {:>6} {:>10} {:>6} {:>11} {:>6} {:>9} {:>8} {:>8} {:>10} {:>9}\n", "rank",
                     "step", "read MiB", "reads", "written MiB", "writes", "busy s", "GB/s",
                     "fwd/bwd", "optimizer", "read/upd");
  for (const auto& s : steps) {
    const double share = s.busy_s > 0 ? 100 / s.busy_s : 0;
    const double hidden = s.read_s > 0 ? 100 * s.reads_during_update_s / s.read_s : 0;
    out += fmt::format(
        "  {:>4} {:>6} {:>10.2f} {:>6} {:>11.2f} {:>6} {:>9.4f} {:>8.2f} {:>7.1f}% {:>9.1f}% {:>8.1f}%{}\n",
        s.rank, s.step, static_cast<double>(s.bytes_read) / (1 << 20), s.reads,
        static_cast<double>(s.bytes_written) / (1 << 20), s.writes, s.busy_s, s.gb_per_s(),
        share * s.during_compute_s, share * s.inside_optimizer_s, hidden,
        s.updated ? "" : "  (no update: read ahead for a step the run did not reach)");
  }
  return out;
}

} // namespace dsa::actors
