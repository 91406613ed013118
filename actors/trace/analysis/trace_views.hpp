// `dsactor trace RUN actor NAME` and `dsactor trace RUN_A diff RUN_B`.
//   actor: one actor's records over time, one line each: its spans with the wait
//          before them (input, credit, idle; trace_waits.hpp) and its messages
//          (sent or received, edge, slot, peer, step, micro-batch, bytes).
//   diff:  per rank and actor, the first span whose (name, step, micro-batch)
//          differs between two runs, the earliest of those, and per step the
//          step time of both runs and its change.
#pragma once

#include "actors/trace/analysis/trace_summary.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dsa::actors {

// The actor called `name` (exact, else the only one whose name contains it); the
// error lists the known actors.
expected<std::uint32_t> find_trace_actor(const trace_data& trace, const std::string& name);
// The table of `actor`'s records, optionally only those of step `step`.
std::string format_actor_view(const trace_data& trace, std::uint32_t actor, std::optional<std::uint32_t> step);

struct schedule_difference {
  std::uint32_t rank = 0;
  std::string actor;
  std::size_t index = 0;      // the actor's index-th span (0-based)
  std::string a, b;           // "forward s0 mb1 at 0.0123 s", or "(no more spans)"
  double time_s = 0;          // when the first of the two spans started (its run's clock)
};

struct run_difference {
  std::vector<schedule_difference> actors; // actors whose spans differ, by time of difference
  std::vector<std::string> only_in_a, only_in_b; // actors in one run only ("rank r: name")
  struct step_change {
    std::uint32_t rank = 0, step = 0;
    double a_s = -1, b_s = -1; // -1: the step is not in that run
  };
  std::vector<step_change> steps;
};

run_difference diff_runs(const std::vector<rank_trace>& a, const std::vector<rank_trace>& b);
std::string format_run_difference(const run_difference& d);

} // namespace dsa::actors
