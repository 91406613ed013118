// The state one `dsactor run` shares between its setup, its optimizer shards,
// step decisions and its step reporter.
#pragma once

#include "actors/train/bert_stage.hpp"
#include "actors/train/feed_source.hpp"
#include "actors/train/metrics.hpp"
#include "actors/train/progress.hpp"
#include "actors/train/run_config.hpp"
#include "actors/train/step_sync.hpp"
#include "core/config.hpp"
#include "models/bert/bert_range.hpp"
#include "models/tokenizer/bert_tokenizer.hpp"
#include "optim/loss_scaler.hpp"
#include "optim/lr_schedule.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace dsa::train {

// The decision state shared by the shards; touched only inside step_sync::decide.
struct decision_state {
  optim::loss_scaler scaler;
  bool scaling = false;
  std::unique_ptr<optim::lr_schedule> schedule;
  // Local decisions: shard s > 0 steps its own copy of the schedule (shard 0 uses `schedule`).
  std::vector<std::unique_ptr<optim::lr_schedule>> replicas;
  double base_lr = 0.0;
  double clip = 0.0;
  std::int64_t skipped = 0;
};

struct run_context {
  run_config rc;
  config cfg;
  std::unique_ptr<tok::bert_tokenizer> tokenizer;
  std::unique_ptr<batch_provider> provider;
  std::vector<bert::bert_range> ranges;
  stage_shared shared;
  std::vector<std::unique_ptr<bert_stage>> stages;
  decision_state decisions;
  std::uint32_t first_step = 0;
  std::uint32_t last_step = 0; // inclusive
};

// Interval checkpoints are taken inside the step; the final one and one asked for by
// a signal are taken after the run from the shards (which then hold that step's state).
bool checkpoint_due(const run_context& ctx, std::uint32_t step);
// The global decision (step_sync::decide, once per step, under its lock): overflow and
// loss scale, clipping factor, lr; advances the schedule unless the step is skipped.
step_decision decide_step(run_context& ctx, std::uint32_t step,
                          const std::vector<step_contribution>& all);
// A shard's own decision when nothing needs the other stages (decision_scope::local).
step_decision decide_local(run_context& ctx, std::uint32_t shard, std::uint32_t step,
                           const step_contribution& c);

// What the last shard to finish a step does: metrics, progress, and the checkpoint
// when one is due. Called from one optimizer worker at a time (step_sync phase 3).
class step_reporter {
public:
  step_reporter(run_context& ctx, feed_source& source, metrics_writer& metrics, progress& bar)
      : ctx_(ctx), source_(source), metrics_(metrics), bar_(bar),
        last_(std::chrono::steady_clock::now()) {}

  // sum_of_squares: the step's gradient sum of squares over all stages (loss-scaled).
  void on_step(std::uint32_t step, const step_decision& d,
               std::vector<step_sync::payload>& payloads, double sum_of_squares);
  // Writes the checkpoint of the state after `step` from every shard's payload.
  void save(std::uint32_t step, std::vector<step_sync::payload>& payloads);

  double last_loss() const { return last_loss_; }
  std::int64_t last_saved() const { return last_saved_; }

private:
  std::string breakdown();

  run_context& ctx_;
  feed_source& source_;
  metrics_writer& metrics_;
  progress& bar_;
  std::chrono::steady_clock::time_point last_;
  double last_loss_ = 0.0;
  std::int64_t last_saved_ = -1;
};

} // namespace dsa::train
