// The coordinator: wires and monitors every actor of the run, counts finished
// steps, and ends the run. On any failure (an actor's down message, or no
// progress within the watchdog deadline) it records which actor failed, in
// which step and why, stops every actor, and answers the start request with an
// error; it never leaves the caller waiting. After each completed step it calls
// the step hooks and, when any step hook is set, allows the optimizer
// shards the next step's update (or ends the run cleanly instead). Phases:
// idle -> running -> stopping -> done.
#pragma once

#include "actors/actor_setup.hpp"
#include "actors/protocol/errors.hpp"
#include "actors/step_hooks.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dsa::actors {

// Written by the coordinator; read by the caller after the start request is answered.
struct run_summary {
  std::uint32_t steps_completed = 0; // counted from the plan's first_step
  std::vector<double> losses;        // [i]: mean micro-batch loss of step first_step + i (last stage),
                                     // when pipeline_options::keep_losses
  double last_loss = 0;              // the last step's, either way
  // The data source's position after the last completed step (data_position; empty if none came).
  std::vector<std::uint64_t> last_position;
  std::optional<failure_info> failure;
  std::string trace_error; // "" when the trace was written (or not asked for)
};

struct coordinator_args {
  actor_setup setup;
  std::vector<caf::actor> stages, shards, reducers;
  caf::actor feeder, tracer;
  std::shared_ptr<run_summary> summary;
  step_hooks hooks; // with a hook the shards wait for allow_atom before each step's update
  std::chrono::milliseconds watchdog{60000}; // no step or update report for this long: fail
  // Called once every actor was sent its peers (before the feeder starts): messages from
  // other processes may be delivered from then on, behind the wiring.
  std::function<void()> wired;
};

// Spawns the coordinator. A request (start_atom) runs the job; the reply is done_atom or an error.
caf::actor spawn_coordinator(caf::actor_system& sys, coordinator_args args);

} // namespace dsa::actors
