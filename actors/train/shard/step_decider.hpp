// The per-step decision of one optimizer shard: DeepSpeed's choices at the
// gradient-accumulation boundary (skip on fp16 overflow and lower the loss
// scale, the clipping factor from the global norm, the learning rate and
// momentum of the schedule). Every shard owns a replica; the reducers hand all
// shards the same totals, so all replicas decide the same, bit for bit, with no
// shared state between the shards (as every data-parallel rank of DeepSpeed
// decides for itself from the all-reduced norm and overflow flag).
#pragma once

#include "actors/compute.hpp"
#include "optim/loss_scaler.hpp"
#include "optim/lr_schedule.hpp"

#include <cstdint>
#include <memory>

namespace dsa::train {

struct step_decision {
  bool skip = false;        // overflow: no update, no schedule step
  double scaled_norm = 0.0; // global norm of the loss-scaled gradients (own stage's with local totals)
  double grad_scale = 1.0;  // multiply gradients by this (1 / (loss_scale x clip))
  double loss_scale = 1.0;  // the scale this step's gradients carry
  double lr = 0.0;          // learning rate of this update
  bool set_betas = false;   // OneCycle momentum cycling
  double beta1 = 0.0, beta2 = 0.0;
  // After the step, as DeepSpeed's monitor logs them: the schedule's next lr and the
  // updated loss scale.
  double lr_after = 0.0;
  double loss_scale_after = 1.0;
};

struct step_decider_options {
  double base_lr = 0.0;  // without a schedule
  double clip = 0.0;     // gradient_clipping; 0: off
  bool scaling = false;  // fp16 dynamic or static loss scaling
  optim::loss_scaler_params scaler;
  int rank = 0;          // only rank 0 logs the loss scaler's lines
};

class step_decider {
public:
  step_decider(const step_decider_options& options, std::unique_ptr<optim::lr_schedule> schedule);

  // With global totals: skip on overflow (loss scaling) or non-finite gradients,
  // clip by the global norm. With a stage's own totals (no clipping, no loss
  // scaling): a non-finite gradient is an error, since the other stages would update.
  step_decision decide(std::uint32_t step, const actors::grad_totals& totals);

  // Speculation: the decision decide() will return when the totals show no overflow and
  // the clipping does not fire (grad_scale 1 / loss scale), without changing any state.
  step_decision assume() const;
  // Whether decide() needs the step's totals (clipping, or loss scaling and its overflow
  // check); without, its decision is assume()'s whatever the gradients (a non-finite one
  // is an error either way).
  bool needs_totals() const { return options_.clip > 0 || options_.scaling; }
  bool loss_scaling() const { return options_.scaling; }
  // Whether an update made with `assumed` is the one `decided` asks for, bit for bit.
  static bool same_update(const step_decision& assumed, const step_decision& decided);

  double loss_scale() const { return options_.scaling ? scaler_.scale() : 1.0; }
  double lr() const { return schedule_ ? schedule_->lr() : options_.base_lr; }
  std::int64_t schedule_iteration() const { return schedule_ ? schedule_->last_batch_iteration() : -1; }
  const optim::loss_scaler_state& scaler_state() const { return scaler_.state(); }
  std::int64_t skipped() const { return skipped_; }
  // Resuming: the state a checkpoint recorded.
  void restore(std::int64_t schedule_iteration, const optim::loss_scaler_state& scaler, std::int64_t skipped);

private:
  step_decider_options options_;
  optim::loss_scaler scaler_;
  std::unique_ptr<optim::lr_schedule> schedule_;
  std::int64_t skipped_ = 0;
};

} // namespace dsa::train
