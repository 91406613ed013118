// What the caller of a run sees while it goes: a summary of every completed
// step, and the question whether to stop after it. Both are called on the
// coordinator (a CAF scheduler thread, never a compute worker), once per
// completed step, in step order.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace dsa::actors {

struct step_summary {
  std::uint32_t step = 0; // absolute step number
  double loss = 0;        // mean micro-batch loss of the step (last stage)
  double wall_s = 0;      // seconds from the previous step's completion (the run's start for the first) to this one's
};

struct step_hooks {
  // Progress and metrics. Keep it short (a few file writes): the coordinator
  // handles no message while it runs, so a slow hook delays the next step's
  // optimizer updates (a run with stop_after) and the watchdog. An exception
  // fails the run ("coordinator failed in step k: on_step: ...").
  std::function<void(const step_summary&)> on_step;
  // Called after on_step with the completed step's absolute number (also after
  // the run's last step, which ends the run anyway); true ends the run cleanly
  // after that step (an exception fails it). Same rules as on_step.
  std::function<bool(std::uint32_t completed_step)> stop_after;
  // Called once when the run fails (any actor, the watchdog), before the actors are
  // stopped: the caller wakes compute that may be blocked waiting on other actors'
  // work (a rendezvous between optimizer shards), so the workers can be joined.
  // Must not block.
  std::function<void(const std::string& why)> on_failure;
};

} // namespace dsa::actors
