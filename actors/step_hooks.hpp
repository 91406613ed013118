// What the caller of a run sees while it goes: a summary of every completed
// step, and the question whether to stop after it. Both are called on the
// coordinator's own hook thread (never a CAF scheduler thread, nor a stage's,
// reducer's or shard's worker), once per completed step, in step order, one
// step at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dsa::actors {

struct step_summary {
  std::uint32_t step = 0; // absolute step number
  double loss = 0;        // mean micro-batch loss of the step (last stage)
  double wall_s = 0;      // seconds from the previous step's completion (the run's start for the first) to this one's
  // Sum of squares of the step's gradients over all stages (a tied parameter
  // counted once), as the optimizer shards received them (loss-scaled in fp16).
  double grad_sum_of_squares = 0;
  bool skipped = false; // some shard skipped the update (an overflow skips all)
  // The element-wise sum of the last stage's stage_compute::forward_metrics over
  // the step's micro-batches (empty when the compute reports none).
  std::vector<double> metrics;
  // The data source's position after the step's last micro-batch
  // (batch_source::position, sent by the feeder; empty when the source has none).
  std::vector<std::uint64_t> data_position;
  // step_hooks::local_figures of the step (empty without it): this process's, or with
  // stages across processes the sum over replica 0's processes (every stage once).
  std::vector<double> figures;
};

struct step_hooks {
  // Progress, metrics and checkpoints. The actors (the coordinator too) go on
  // handling messages while it runs. No shard starts the next step's update before it returns (see
  // holds_updates), so the optimizers' state is exactly the state after this step
  // (a consistent checkpoint) while the stages go on with the next step's
  // forward and backward. An exception fails the run ("coordinator failed in
  // step k: step hook threw: ...").
  std::function<void(const step_summary&)> on_step;
  // Called after on_step with the completed step's absolute number (also after
  // the run's last step, which ends the run anyway); true ends the run cleanly
  // after that step (an exception fails it). Same rules as on_step.
  std::function<bool(std::uint32_t completed_step)> stop_after;
  // Figures of this process's stages (wall_clock_breakdown's timers), taken on the hook
  // thread as the step's hooks start, before the summary goes to on_step. Every process
  // of a job sets it or none does, with the same count of figures.
  std::function<std::vector<double>(std::uint32_t step)> local_figures;

  // With either hook set, no shard starts the update of step k + 1 before the
  // hooks of step k returned (the shards' state is then that of step k).
  bool holds_updates() const { return static_cast<bool>(on_step) || static_cast<bool>(stop_after); }
};

} // namespace dsa::actors
