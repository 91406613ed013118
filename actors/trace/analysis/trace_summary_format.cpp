// The trace summary as a terminal user reads it (format_trace_summary); see trace_summary.hpp.
#include "actors/trace/analysis/trace_summary.hpp"

#include "actors/trace/trace_analysis.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace dsa::actors {

namespace {

std::string human_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

std::string describe_end(const rank_usage& r) {
  if (r.end.closed)
    return fmt::format("complete ({} bytes)", r.end.file_bytes);
  return fmt::format("INCOMPLETE: the trace ends at byte {} of {}: {}", r.end.valid_bytes,
                     r.end.file_bytes, r.end.why);
}

// Nearest-rank quantile of `v` (0 <= q <= 1); 0 for none.
double quantile(std::vector<double> v, double q) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  const auto at = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, at == 0 ? 0 : at - 1)];
}

std::vector<const step_usage*> steps_of(const trace_summary& s, std::uint32_t rank) {
  std::vector<const step_usage*> out;
  for (const auto& st : s.steps)
    if (st.rank == rank)
      out.push_back(&st);
  return out;
}

double window_of(const trace_summary& s, std::uint32_t rank) {
  for (const auto& r : s.ranks)
    if (r.rank == rank)
      return r.window_s;
  return 0;
}

// The actor's name without " of rank r": the same actor of every rank.
std::string across_ranks(const std::string& name) {
  const auto at = name.find(" of rank ");
  return at == std::string::npos ? name : name.substr(0, at);
}

// With several ranks, one row per actor of every rank: the means over the ranks, and the
// busiest rank's share.
std::string format_actors_across_ranks(const trace_summary& s) {
  struct sum {
    int ranks = 0;
    actor_usage total;
    double max_busy = -1;
    std::uint32_t max_rank = 0;
  };
  std::vector<std::string> order;
  std::map<std::string, sum> by_name;
  for (const auto& a : s.actors) {
    const std::string name = across_ranks(a.name);
    auto [it, fresh] = by_name.try_emplace(name);
    if (fresh) order.push_back(name);
    sum& t = it->second;
    ++t.ranks;
    t.total.busy_s += a.busy_s;
    t.total.comm_s += a.comm_s;
    t.total.input_wait_s += a.input_wait_s;
    t.total.credit_wait_s += a.credit_wait_s;
    t.total.idle_s += a.idle_s;
    t.total.spans += a.spans;
    t.total.messages_in += a.messages_in;
    t.total.messages_out += a.messages_out;
    t.total.bytes_out += a.bytes_out;
    const double window = window_of(s, a.rank);
    const double busy = window > 0 ? a.busy_s / window : 0.0;
    if (busy > t.max_busy) {
      t.max_busy = busy;
      t.max_rank = a.rank;
    }
  }
  std::string out = fmt::format(
      "\nactors, the mean over {} ranks (busy: compute spans; comm: allreduce spans; the rest of the rank's trace\n"
      "  split into input: waiting for the input of its next span; credit: input there, waiting for its output\n"
      "  slot's release; idle; every rank's row: --steps)\n",
      s.ranks.size());
  std::size_t width = 12;
  for (const auto& n : order) width = std::max(width, n.size());
  out += fmt::format("  {:<{}} {:>8} {:>6} {:>13} {:>8} {:>8} {:>8} {:>8} {:>6} {:>8} {:>10}\n", "actor", width,
                     "busy s", "busy%", "busiest rank", "comm s", "input s", "credit s", "idle s", "spans", "msgs out",
                     "bytes out");
  double mean_window = 0;
  for (const auto& r : s.ranks) mean_window += r.window_s / static_cast<double>(s.ranks.size());
  for (const auto& name : order) {
    const sum& t = by_name.at(name);
    const double n = t.ranks;
    out += fmt::format("  {:<{}} {:>8.3f} {:>5.1f}% {:>5.1f}% rank {:<2} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>6.0f} {:>8.0f} "
                       "{:>10}\n",
                       name, width, t.total.busy_s / n, mean_window > 0 ? 100 * t.total.busy_s / n / mean_window : 0.0,
                       100 * std::max(0.0, t.max_busy), t.max_rank, t.total.comm_s / n, t.total.input_wait_s / n,
                       t.total.credit_wait_s / n, t.total.idle_s / n, static_cast<double>(t.total.spans) / n,
                       static_cast<double>(t.total.messages_out) / n,
                       human_bytes(static_cast<std::uint64_t>(static_cast<double>(t.total.bytes_out) / n)));
  }
  return out;
}

std::string format_actors(const trace_summary& s) {
  std::string out = "\nactors (busy: compute spans; comm: allreduce spans; the rest of the rank's trace split "
                    "into\n  input: waiting for the input of its next span; credit: input there, waiting for its "
                    "output slot's release; idle)\n";
  std::size_t width = 12; // actor names grow " of rank r" with data parallelism
  for (const auto& a : s.actors)
    width = std::max(width, a.name.size());
  out += fmt::format("  {:<{}} {:>8} {:>6} {:>8} {:>8} {:>8} {:>8} {:>6} {:>7} {:>8} {:>10}\n", "actor", width,
                     "busy s", "busy%", "comm s", "input s", "credit s", "idle s", "spans", "msgs in", "msgs out",
                     "bytes out");
  for (const auto& a : s.actors) {
    double window = 0;
    for (const auto& r : s.ranks)
      if (r.rank == a.rank)
        window = r.window_s;
    out += fmt::format("  {:<{}} {:>8.3f} {:>5.1f}% {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>6} {:>7} {:>8} {:>10}\n",
                       a.name, width, a.busy_s, window > 0 ? 100 * a.busy_s / window : 0.0, a.comm_s,
                       a.input_wait_s, a.credit_wait_s, a.idle_s, a.spans, a.messages_in, a.messages_out,
                       human_bytes(a.bytes_out));
  }
  return out;
}

// The old full table: one row per step.
std::string format_step_rows(const trace_summary& s, const rank_usage& r, double theory) {
  std::string out = fmt::format(
      "  {:>6} {:>9} {:>9} {:>8} {:>8} {:>12} {:>9} {:>8} {:>8} {:>10} {:>8} {:>8} {:>9} {:>9}  {}\n", "step",
      "start s", "time s", "bubble", "(S-1)/..", "allreduce s", "overlap", "ar MiB", "bus GB/s", "compute s", "comm s",
      "io s", "comp&comm", "comp&io", "critical path");
  for (const step_usage* st : steps_of(s, r.rank))
    out += fmt::format("  {:>6} {:>9.3f} {:>9.3f} {:>7.1f}% {:>7.1f}% {:>12.3f} {:>8.1f}% {:>8.2f} {:>8.3f} {:>10.3f} "
                       "{:>8.3f} {:>8.3f} {:>9.3f} {:>9.3f}  {}\n",
                       st->step, st->start_s, st->time_s, 100 * st->bubble, 100 * theory, st->allreduce_s,
                       st->allreduce_s > 0 ? 100 * st->overlap_s / st->allreduce_s : 0.0,
                       static_cast<double>(st->allreduce_bytes) / (1 << 20), st->bus_gbps, st->compute_s, st->comm_s,
                       st->io_s, st->compute_comm_s, st->compute_io_s, st->critical_path);
  return out;
}

// A few lines: the distribution of the rank's step times and the figures beside them.
std::string format_step_distribution(const trace_summary& s, const rank_usage& r, double theory) {
  const auto steps = steps_of(s, r.rank);
  if (steps.empty())
    return "  no step spans in this trace\n";
  std::vector<double> time, bubble, allreduce, overlap, bus, compute, comm, io;
  std::map<std::string, int> paths;
  for (const step_usage* st : steps) {
    time.push_back(st->time_s);
    bubble.push_back(st->bubble);
    compute.push_back(st->compute_s);
    comm.push_back(st->comm_s);
    io.push_back(st->io_s);
    if (st->allreduce_s > 0) {
      allreduce.push_back(st->allreduce_s);
      overlap.push_back(st->overlap_s / st->allreduce_s);
    }
    if (st->bus_gbps > 0)
      bus.push_back(st->bus_gbps);
    ++paths[st->critical_path];
  }
  std::vector<const step_usage*> slowest(steps);
  std::stable_sort(slowest.begin(), slowest.end(),
                   [](const step_usage* a, const step_usage* b) { return a->time_s > b->time_s; });
  std::string slow;
  for (std::size_t i = 0; i < std::min<std::size_t>(3, slowest.size()); ++i)
    slow += fmt::format("{}{} ({:.3f} s)", i ? ", " : "", slowest[i]->step, slowest[i]->time_s);
  std::string out = fmt::format("  step time  median {:.3f} s, p90 {:.3f} s, max {:.3f} s; slowest steps: {}\n",
                                quantile(time, 0.5), quantile(time, 0.9), slowest.front()->time_s, slow);
  if (r.stages > 0)
    out += fmt::format("  bubble     median {:.1f}%, p90 {:.1f}% of the stages' forward-to-backward window "
                       "(against (S-1)/(M+S-1) = {:.1f}%)\n",
                       100 * quantile(bubble, 0.5), 100 * quantile(bubble, 0.9), 100 * theory);
  if (!allreduce.empty())
    out += fmt::format("  allreduce  median {:.3f} s a step, {:.1f}% of it during backward (median){}\n",
                       quantile(allreduce, 0.5), 100 * quantile(overlap, 0.5),
                       bus.empty() ? "" : fmt::format("; bus {:.3f} GB/s (median)", quantile(bus, 0.5)));
  else if (!bus.empty())
    out += fmt::format("  allreduce  bus {:.3f} GB/s (median)\n", quantile(bus, 0.5));
  out += fmt::format("  per step   compute {:.3f} s, communication {:.3f} s, I/O {:.3f} s (medians of their unions)\n",
                     quantile(compute, 0.5), quantile(comm, 0.5), quantile(io, 0.5));
  const auto common = std::max_element(paths.begin(), paths.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
  if (!common->first.empty())
    out += fmt::format("  critical   {} (the most common path: {} of {} steps)\n", common->first, common->second,
                       steps.size());
  return out;
}

// With several ranks, one row per rank of its step-time distribution and figures.
std::string format_steps_across_ranks(const trace_summary& s) {
  const rank_usage& r0 = s.ranks.front();
  const double theory =
      r0.stages > 0 && r0.micro_batches > 0 ? theoretical_bubble(r0.stages, r0.micro_batches) : 0.0;
  std::string out = fmt::format("\nsteps per rank (S = {} stages, M = {} micro-batches: bubble (S-1)/(M+S-1) = {:.1f}%; "
                                "medians unless named)\n",
                                r0.stages, r0.micro_batches, 100 * theory);
  out += fmt::format("  {:>4} {:>5} {:>9} {:>9} {:>16} {:>7} {:>11} {:>8} {:>9}\n", "rank", "steps", "step s", "p90 s",
                     "max s (step)", "bubble", "allreduce s", "overlap", "bus GB/s");
  for (const auto& r : s.ranks) {
    const auto steps = steps_of(s, r.rank);
    if (steps.empty()) {
      out += fmt::format("  {:>4} {:>5}\n", r.rank, 0);
      continue;
    }
    std::vector<double> time, bubble, allreduce, overlap, bus;
    const step_usage* slowest = steps.front();
    for (const step_usage* st : steps) {
      time.push_back(st->time_s);
      bubble.push_back(st->bubble);
      if (st->allreduce_s > 0) {
        allreduce.push_back(st->allreduce_s);
        overlap.push_back(st->overlap_s / st->allreduce_s);
      }
      if (st->bus_gbps > 0) bus.push_back(st->bus_gbps);
      if (st->time_s > slowest->time_s) slowest = st;
    }
    out += fmt::format("  {:>4} {:>5} {:>9.3f} {:>9.3f} {:>9.3f} ({:>4}) {:>6.1f}% {:>11.3f} {:>7.1f}% {:>9.3f}\n",
                       r.rank, steps.size(), quantile(time, 0.5), quantile(time, 0.9), slowest->time_s, slowest->step,
                       100 * quantile(bubble, 0.5), quantile(allreduce, 0.5), 100 * quantile(overlap, 0.5),
                       quantile(bus, 0.5));
  }
  return out;
}

// The closing line: where a rank's step time went and what bounds the step.
std::string format_verdict(const trace_summary& s, const rank_usage& r, double theory) {
  const auto steps = steps_of(s, r.rank);
  if (steps.empty())
    return fmt::format("\nrank {}: no steps recorded, so nothing bounds a step\n", r.rank);
  double total = 0, compute = 0, comm = 0, io = 0;
  std::vector<double> bubble;
  for (const step_usage* st : steps) {
    total += st->time_s;
    compute += st->compute_s;
    comm += std::max(0.0, st->comm_s - st->compute_comm_s);
    io += std::max(0.0, st->io_s - st->compute_io_s - st->comm_io_s);
    bubble.push_back(st->bubble);
  }
  const double other = std::max(0.0, total - compute - comm - io);
  const auto pct = [&](double x) { return total > 0 ? 100 * std::min(x, total) / total : 0.0; };
  std::string out = fmt::format(
      "\nwhere the time went (rank {}): {} steps took {:.3f} s of a {:.3f} s trace; of the steps' time,\n  compute "
      "{:.0f}%, communication outside compute {:.0f}%, I/O outside both {:.0f}%, no span running {:.0f}%\n",
      r.rank, steps.size(), total, r.window_s, pct(compute), pct(comm), pct(io), pct(other));
  const actor_usage* busiest = nullptr;
  for (const auto& a : s.actors)
    if (a.rank == r.rank && (!busiest || a.busy_s > busiest->busy_s))
      busiest = &a;
  const double median_bubble = quantile(bubble, 0.5);
  std::string bound;
  if (comm > 0 && comm >= compute && comm >= io)
    bound = "communication: the allreduce runs outside compute for most of the step (overlap it with backward: "
            "zero_optimization.overlap_comm, smaller buckets)";
  else if (io > 0 && io >= compute)
    bound = "I/O: the NVMe swap runs outside compute for most of the step (more aio buffers or a faster device)";
  else if (r.stages > 1 && median_bubble > theory + 0.10)
    bound = fmt::format("the pipeline: stages idle {:.0f}% of the step against {:.0f}% for (S-1)/(M+S-1) (an "
                        "unbalanced split or too few micro-batches)",
                        100 * median_bubble, 100 * theory);
  else if (busiest)
    bound = fmt::format("compute in {} (busy {:.0f}% of the trace)", busiest->name,
                        r.window_s > 0 ? 100 * busiest->busy_s / r.window_s : 0.0);
  else
    bound = "compute";
  return out + fmt::format("the step is bound by {}\n", bound);
}

} // namespace

std::string format_trace_summary(const trace_summary& s, summary_format format) {
  std::string out;
  out += "traces\n";
  for (const auto& r : s.ranks)
    out += fmt::format("  rank {}: {} (version {}), {} records over {:.3f} s, {}\n", r.rank, r.path,
                       r.version, r.records, r.window_s, describe_end(r));
  if (s.ranks.size() > 1) {
    out += fmt::format("  clocks: {};\n  the steps' start times are on the common clock, where each rank's trace "
                       "begins at",
                       s.clock);
    for (std::size_t i = 0; i < s.ranks.size() && i < s.offset_s.size(); ++i)
      out += fmt::format("{} +{:.6f} s (rank {})", i ? "," : "", s.offset_s[i], s.ranks[i].rank);
    out += "\n  (so do the critical-path, actor, html and export views)\n";
  }
  const bool across = s.ranks.size() > 1 && !format.per_step;
  out += across ? format_actors_across_ranks(s) : format_actors(s);
  for (const auto& r : s.ranks) {
    if (r.gpu_busy_s.empty()) continue;
    out += fmt::format("GPU busy (its kernels' time, from CUDA events) of rank {}:", r.rank);
    for (std::size_t st = 0; st < r.gpu_busy_s.size(); ++st)
      out += fmt::format("{} stage {} {:.3f} s ({:.1f}% of the trace)", st ? "," : "", st, r.gpu_busy_s[st],
                         r.window_s > 0 ? 100 * r.gpu_busy_s[st] / r.window_s : 0.0);
    out += "\n";
  }
  if (across) out += format_steps_across_ranks(s);
  for (const auto& r : across ? std::vector<rank_usage>{} : s.ranks) {
    const double theory =
        r.stages > 0 && r.micro_batches > 0 ? theoretical_bubble(r.stages, r.micro_batches) : 0.0;
    out += fmt::format("\nsteps of rank {}: {} (S = {} stages, M = {} micro-batches: bubble "
                       "(S-1)/(M+S-1) = {:.1f}%)\n",
                       r.rank, steps_of(s, r.rank).size(), r.stages, r.micro_batches, 100 * theory);
    out += format.per_step ? format_step_rows(s, r, theory) : format_step_distribution(s, r, theory);
  }
  for (const auto& r : s.ranks)
    if (!r.end.closed)
      out += fmt::format("\nrank {}: the trace ends at byte {} of {} ({}); steps after that are "
                         "missing or partial\n",
                         r.rank, r.end.valid_bytes, r.end.file_bytes, r.end.why);
  if (!format.per_step)
    out += "(every step's row: dsactor trace RUN summary --steps)\n";
  out += format.before_verdict;
  const auto theory_of = [](const rank_usage& r) {
    return r.stages > 0 && r.micro_batches > 0 ? theoretical_bubble(r.stages, r.micro_batches) : 0.0;
  };
  if (across) {
    // The job goes at its slowest rank's pace: its verdict.
    const rank_usage* slowest = &s.ranks.front();
    double slowest_total = -1;
    for (const auto& r : s.ranks) {
      double total = 0;
      for (const step_usage* st : steps_of(s, r.rank)) total += st->time_s;
      if (total > slowest_total) {
        slowest_total = total;
        slowest = &r;
      }
    }
    out += fmt::format("\nthe slowest rank is rank {} (its steps' summed time); the job goes at its pace:", slowest->rank);
    out += format_verdict(s, *slowest, theory_of(*slowest));
    return out;
  }
  for (const auto& r : s.ranks) out += format_verdict(s, r, theory_of(r));
  return out;
}

} // namespace dsa::actors
