// What happens after each completed step of `dsactor run` on the job's rank 0: metrics,
// progress, and the checkpoint when one is due.
#pragma once

#include "actors/step_hooks.hpp"
#include "actors/train/shard/model_shard.hpp"
#include "actors/train/run/metrics.hpp"
#include "actors/train/run/progress.hpp"
#include "actors/train/run/run_context.hpp"
#include "actors/train/run/stage_states.hpp"

#include <chrono>
#include <functional>
#include <cstdint>
#include <vector>

namespace dsa::train {

// Interval checkpoints are taken after the step on the coordinator (the shards then
// wait); the final one and one asked for by a signal after the run.
bool checkpoint_due(const run_config& rc, std::uint32_t step);

// What happens after each completed step (the run's on_step hook, on the
// coordinator): metrics, progress, and the checkpoint when one is due. The
// shards are idle then and hold the state after the step: the run has a
// stop_after hook, so no shard starts the next update before this returns.
class step_reporter {
public:
  // in: the config and the rank; model: the stages (checked after the first step, their
  // wall_clock_breakdown counters taken every step) and their layer ranges.
  step_reporter(const run_inputs& in, rank_model& model, metrics_writer& metrics, progress& bar,
                std::vector<const model_shard*> shards)
      : in_(in), model_(model), metrics_(metrics), bar_(bar), shards_(std::move(shards)),
        last_(std::chrono::steady_clock::now()) {}

  void on_step(const actors::step_summary& s);
  // Writes the checkpoint of the state after `step` from the shards;
  // data_position: the data source's position after that step (step_summary::data_position).
  void save(std::uint32_t step, const std::vector<std::uint64_t>& data_position);

  // Stages across processes: stage s's part of the checkpoint (its payload and the files
  // its ranks staged), which another process holds (shards[s] is null), received from it
  // (stage_states.hpp).
  void set_remote_part(std::function<stage_checkpoint_part(std::uint32_t stage)> fetch) { remote_part_ = std::move(fetch); }

  double last_loss() const { return last_loss_; }
  std::int64_t last_saved() const { return last_saved_; }

private:
  // The wall_clock_breakdown counters of the step in ms, summed over stages: the summary's
  // figures (every stage of the replica, step_hooks::local_figures), or this process's.
  struct step_times {
    double forward_ms = 0, backward_ms = 0, step_ms = 0;
  };
  step_times take_times(const actors::step_summary& s);

  const run_inputs& in_;
  rank_model& model_;
  metrics_writer& metrics_;
  progress& bar_;
  std::vector<const model_shard*> shards_;
  std::chrono::steady_clock::time_point last_;
  double last_loss_ = 0.0;
  std::int64_t last_saved_ = -1;
  bool states_measured_ = false; // the model-state bytes were compared after the first step
  std::function<stage_checkpoint_part(std::uint32_t)> remote_part_;
};

} // namespace dsa::train
