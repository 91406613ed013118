// The trace summary; see trace_summary.hpp.
#include "actors/trace/analysis/trace_summary.hpp"

#include "actors/trace/analysis/trace_clock.hpp"
#include "actors/trace/analysis/trace_join.hpp"
#include "actors/trace/trace_analysis.hpp"
#include "actors/trace/analysis/trace_critical_path.hpp"
#include "actors/trace/trace_file.hpp"
#include "actors/trace/analysis/trace_waits.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <regex>

namespace dsa::actors {

namespace {

namespace fs = std::filesystem;

using interval = std::pair<std::uint64_t, std::uint64_t>;

// Length of the union of intervals, in seconds.
double union_s(std::vector<interval> xs) {
  std::sort(xs.begin(), xs.end());
  std::uint64_t total = 0, lo = 0, hi = 0;
  bool open = false;
  for (const auto& [a, b] : xs) {
    if (open && a <= hi) {
      hi = std::max(hi, b);
      continue;
    }
    if (open)
      total += hi - lo;
    lo = a;
    hi = b;
    open = true;
  }
  if (open)
    total += hi - lo;
  return static_cast<double>(total) * 1e-9;
}

std::uint32_t parse_u32(const std::string& text, std::uint32_t fallback) {
  try {
    return text.empty() ? fallback : static_cast<std::uint32_t>(std::stoul(text));
  } catch (const std::exception&) {
    return fallback;
  }
}

int role_order(const std::string& role) {
  static const char* const order[] = {"coordinator", "feeder",    "stage",
                                      "reducer",     "optimizer", "tracer"};
  for (int i = 0; i < 6; ++i)
    if (role == order[i])
      return i;
  return 6;
}

bool is_name(const trace_data& t, const trace_record& r, const char* name) {
  return t.names[r.name] == name;
}

// Per step: the window of its spans, its bubble and its allreduce overlap.
void summarize_steps(const trace_data& t, const trace_index& index, const rank_usage& rank,
                     std::vector<step_usage>& out) {
  std::map<std::uint32_t, trace_data> by_step;
  std::map<std::uint32_t, std::size_t> last_span;
  std::map<std::uint32_t, std::vector<interval>> io_by_step;
  for (std::size_t i = 0; i < t.records.size(); ++i) {
    const auto& r = t.records[i];
    if (r.kind != static_cast<std::uint8_t>(trace_kind::span) || is_name(t, r, "load") ||
        is_device_span(t.names[r.name])) // on the device: summed per stage (gpu_busy_s)
      continue;
    // I/O spans (the NVMe swap) run beside the step (a prefetch before it, writes behind it):
    // they count in its io columns, not in its window, bubble or critical path.
    if (is_io_span(t.names[r.name])) {
      if (!is_name(t, r, "swap_update")) // compute, inside the shard's optimizer span
        io_by_step[r.step].emplace_back(r.t0_ns, r.t1_ns);
      continue;
    }
    auto last = last_span.emplace(r.step, i).first;
    if (r.t1_ns > t.records[last->second].t1_ns)
      last->second = i;
    auto& step = by_step[r.step];
    if (step.names.empty())
      step.names = t.names;
    step.records.push_back(r);
  }
  for (const auto& [k, step] : by_step) {
    step_usage u;
    u.rank = rank.rank;
    u.step = k;
    std::uint64_t lo = ~0ull, hi = 0;
    for (const auto& r : step.records) {
      lo = std::min(lo, r.t0_ns);
      hi = std::max(hi, r.t1_ns);
    }
    u.start_s = static_cast<double>(lo) * 1e-9 + rank.offset_s; // on the common clock
    u.time_s = static_cast<double>(hi - lo) * 1e-9;
    std::vector<interval> compute, comm, io = io_by_step[k];
    std::uint64_t allreduce_ns = 0;
    for (const auto& r : step.records) {
      const auto& name = t.names[r.name];
      (name == "allreduce" ? comm : is_io_span(name) ? io : compute).emplace_back(r.t0_ns, r.t1_ns);
      if (name == "allreduce") {
        u.allreduce_bytes += r.bytes;
        allreduce_ns += r.t1_ns - r.t0_ns;
      }
    }
    const double n = static_cast<double>(rank.ranks);
    if (allreduce_ns > 0 && n > 1)
      u.bus_gbps = static_cast<double>(u.allreduce_bytes) / static_cast<double>(allreduce_ns) * 2 * (n - 1) / n;
    const auto both = [](const std::vector<interval>& a, const std::vector<interval>& b) {
      std::vector<interval> ab(a);
      ab.insert(ab.end(), b.begin(), b.end());
      return std::max(0.0, union_s(a) + union_s(b) - union_s(ab));
    };
    u.compute_s = union_s(compute);
    u.comm_s = union_s(comm);
    u.io_s = union_s(io);
    u.compute_comm_s = both(compute, comm);
    u.compute_io_s = both(compute, io);
    u.comm_io_s = both(comm, io);
    u.critical_path = critical_path_shares(walk_critical_path(t, index, last_span.at(k), lo), 2);
    if (rank.stages > 0) {
      double idle = 0;
      const auto stages = stage_idle_fractions(step, rank.stages, std::max(rank.micro_batches, 1u));
      for (const auto& s : stages)
        idle += s.idle_fraction;
      u.bubble = stages.empty() ? 0 : idle / static_cast<double>(stages.size());
      for (const auto& o : allreduce_overlap(step, rank.stages)) {
        u.allreduce_s += o.allreduce_s;
        u.overlap_s += o.overlapped_s;
      }
    }
    out.push_back(u);
  }
}

void summarize_actors(const trace_data& t, const trace_index& index, const rank_usage& rank,
                      std::vector<actor_usage>& out) {
  struct acc {
    actor_usage u;
    std::vector<interval> compute, comm, all;
    bool seen = false;
  };
  std::vector<acc> actors(t.actors.size());
  const auto& waits = index.timelines;
  for (const auto& r : t.records) {
    if (r.actor >= actors.size())
      actors.resize(r.actor + 1);
    auto& a = actors[r.actor];
    a.seen = true;
    if (r.stage >= 0 && a.u.stage < 0)
      a.u.stage = r.stage;
    switch (static_cast<trace_kind>(r.kind)) {
    case trace_kind::span:
      if (is_beside_span(t.names[r.name])) // on the aio engine or the device, beside the actor's worker
        break;
      ++a.u.spans;
      (is_name(t, r, "allreduce") ? a.comm : a.compute).emplace_back(r.t0_ns, r.t1_ns);
      a.all.emplace_back(r.t0_ns, r.t1_ns);
      break;
    case trace_kind::send:
      ++a.u.messages_out;
      a.u.bytes_out += r.bytes;
      break;
    case trace_kind::recv:
      ++a.u.messages_in;
      a.u.bytes_in += r.bytes;
      break;
    }
  }
  for (std::size_t id = 0; id < actors.size(); ++id) {
    auto& a = actors[id];
    if (!a.seen)
      continue;
    a.u.name =
        id < t.actors.size() && !t.actors[id].empty() ? t.actors[id] : fmt::format("actor {}", id);
    a.u.role = a.u.name.substr(0, a.u.name.find(' '));
    a.u.rank = rank.rank;
    a.u.busy_s = union_s(std::move(a.compute));
    a.u.comm_s = union_s(std::move(a.comm));
    if (id < waits.size()) {
      a.u.input_wait_s = static_cast<double>(waits[id].input_wait_ns) * 1e-9;
      a.u.credit_wait_s = static_cast<double>(waits[id].credit_wait_ns) * 1e-9;
      a.u.idle_s = static_cast<double>(waits[id].idle_ns) * 1e-9;
    } else {
      a.u.idle_s = std::max(0.0, rank.window_s - union_s(std::move(a.all)));
    }
    out.push_back(std::move(a.u));
  }
}

} // namespace

bool is_io_span(const std::string& name) {
  return name.rfind("swap", 0) == 0 || name.rfind("nvme", 0) == 0 || name.rfind("io", 0) == 0;
}

bool is_device_span(const std::string& name) { return name.rfind("gpu", 0) == 0; }

bool is_beside_span(const std::string& name) { return is_io_span(name) || is_device_span(name); }

expected<std::vector<rank_trace>> load_run_traces(const std::string& run_dir_or_file, bool join_processes) {
  std::vector<std::pair<std::uint32_t, std::string>> files;
  std::error_code ec;
  if (fs::is_directory(run_dir_or_file, ec)) {
    static const std::regex rank_file(R"(trace\.rank([0-9]+)\.dsat)");
    for (const auto& entry : fs::directory_iterator(run_dir_or_file, ec)) {
      const auto name = entry.path().filename().string();
      std::smatch m;
      if (name == "trace.dsat")
        files.emplace_back(0, entry.path().string());
      else if (std::regex_match(name, m, rank_file))
        files.emplace_back(parse_u32(m[1], 0), entry.path().string());
    }
    if (ec)
      return make_error(errc::io, "cannot list run directory {}: {}", run_dir_or_file,
                        ec.message());
    if (files.empty())
      return make_error(errc::not_found, "{} holds no trace.dsat (nor trace.rank<r>.dsat)",
                        run_dir_or_file);
  } else {
    files.emplace_back(0, run_dir_or_file);
  }
  std::sort(files.begin(), files.end());
  std::vector<rank_trace> out;
  for (const auto& [rank, path] : files) {
    DSA_ASSIGN_OR_RETURN(auto trace, read_trace(path));
    rank_trace r{parse_u32(trace.info_value("rank"), rank), path, std::move(trace)};
    out.push_back(std::move(r));
  }
  // Stages across processes: one trace per replica (trace_join.hpp).
  if (!join_processes) return out;
  return join_pipeline_processes(std::move(out));
}

trace_summary summarize_traces(const std::vector<rank_trace>& traces) {
  trace_summary out;
  const trace_clocks clocks = align_trace_clocks(traces);
  out.clock = clocks.how;
  for (std::uint64_t o : clocks.offset_ns) out.offset_s.push_back(static_cast<double>(o) * 1e-9);
  for (std::size_t i = 0; i < traces.size(); ++i) {
    const auto& rt = traces[i];
    const auto& t = rt.trace;
    rank_usage r;
    r.rank = rt.rank;
    r.offset_s = i < out.offset_s.size() ? out.offset_s[i] : 0;
    r.path = rt.path;
    r.version = t.version;
    r.records = t.records.size();
    r.end = t.end;
    // Old traces lack the info frame: the shape follows from the records.
    std::uint32_t stages = 0, micro_batches = 0;
    std::uint64_t lo = ~0ull, hi = 0;
    for (const auto& rec : t.records) {
      lo = std::min(lo, rec.t0_ns);
      hi = std::max(hi, std::max(rec.t0_ns, rec.t1_ns));
      if (rec.kind == static_cast<std::uint8_t>(trace_kind::span) && is_name(t, rec, "forward")) {
        stages = std::max<std::uint32_t>(stages, static_cast<std::uint32_t>(rec.stage + 1));
        micro_batches = std::max(micro_batches, rec.micro_batch + 1);
      }
    }
    r.window_s = t.records.empty() ? 0 : static_cast<double>(hi - lo) * 1e-9;
    std::vector<std::vector<interval>> device(1);
    for (const auto& rec : t.records)
      if (rec.kind == static_cast<std::uint8_t>(trace_kind::span) && rec.stage >= 0 &&
          is_device_span(t.names[rec.name])) {
        if (device.size() <= static_cast<std::size_t>(rec.stage)) device.resize(static_cast<std::size_t>(rec.stage) + 1);
        device[static_cast<std::size_t>(rec.stage)].emplace_back(rec.t0_ns, rec.t1_ns);
      }
    bool any_device = false;
    for (const auto& d : device) any_device = any_device || !d.empty();
    if (any_device)
      for (auto& d : device) r.gpu_busy_s.push_back(union_s(std::move(d)));
    r.stages = parse_u32(t.info_value("stages"), stages);
    r.micro_batches = parse_u32(t.info_value("micro_batches"), micro_batches);
    r.ranks = std::max(1u, parse_u32(t.info_value("ranks"), 1));
    const trace_index index(t);
    summarize_actors(t, index, r, out.actors);
    summarize_steps(t, index, r, out.steps);
    out.ranks.push_back(r);
  }
  std::stable_sort(out.actors.begin(), out.actors.end(),
                   [](const actor_usage& a, const actor_usage& b) {
                     return std::make_tuple(role_order(a.role), a.role, a.rank, a.stage, a.name) <
                            std::make_tuple(role_order(b.role), b.role, b.rank, b.stage, b.name);
                   });
  return out;
}

} // namespace dsa::actors
