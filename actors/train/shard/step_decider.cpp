// One shard's per-step decision; see step_decider.hpp.
#include "actors/train/shard/step_decider.hpp"

#include "core/log.hpp"
#include "optim/grad_clip.hpp"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

namespace dsa::train {

step_decider::step_decider(const step_decider_options& options, std::unique_ptr<optim::lr_schedule> schedule)
    : options_(options), scaler_(options.scaler, options.rank), schedule_(std::move(schedule)) {}

step_decision step_decider::decide(std::uint32_t step, const actors::grad_totals& totals) {
  const bool overflow = !std::isfinite(totals.sum_of_squares);
  if (overflow && !totals.global)
    throw std::runtime_error(
        fmt::format("non-finite gradients in step {} (without loss scaling or clipping; enable "
                    "fp16 loss scaling or gradient_clipping)",
                    step));
  step_decision d;
  d.loss_scale = loss_scale();
  if (options_.scaling) {
    auto u = scaler_.update(overflow);
    if (!u) throw std::runtime_error(u.err().message);
    d.skip = u->skip_step;
  } else if (overflow) {
    if (options_.rank == 0) log_warn("step {}: non-finite gradients without loss scaling; step skipped", step);
    d.skip = true;
  }
  d.scaled_norm = std::sqrt(totals.sum_of_squares);
  d.lr = lr();
  if (d.skip) {
    ++skipped_;
  } else {
    d.grad_scale = 1.0 / optim::combined_unscale_clip(d.scaled_norm, d.loss_scale, totals.global ? options_.clip : 0.0);
    if (schedule_) {
      if (auto b = schedule_->momentum()) {
        d.set_betas = true;
        d.beta1 = b->beta1;
        d.beta2 = b->beta2;
      }
      schedule_->step();
    }
  }
  d.lr_after = lr();
  d.loss_scale_after = loss_scale();
  return d;
}

step_decision step_decider::assume() const {
  step_decision d;
  d.loss_scale = loss_scale();
  d.lr = lr();
  d.grad_scale = 1.0 / optim::combined_unscale_clip(0.0, d.loss_scale, 0.0); // decide()'s expression, unclipped
  if (schedule_)
    if (auto b = schedule_->momentum()) {
      d.set_betas = true;
      d.beta1 = b->beta1;
      d.beta2 = b->beta2;
    }
  return d;
}

bool step_decider::same_update(const step_decision& assumed, const step_decision& decided) {
  return !assumed.skip && !decided.skip && assumed.grad_scale == decided.grad_scale && assumed.lr == decided.lr &&
         assumed.set_betas == decided.set_betas && assumed.beta1 == decided.beta1 && assumed.beta2 == decided.beta2;
}

void step_decider::restore(std::int64_t schedule_iteration, const optim::loss_scaler_state& scaler,
                           std::int64_t skipped) {
  if (schedule_) schedule_->set_last_batch_iteration(schedule_iteration);
  if (options_.scaling) scaler_.load_state(scaler);
  skipped_ = skipped;
}

} // namespace dsa::train
