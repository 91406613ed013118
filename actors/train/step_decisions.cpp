// Per-step decisions of a run's optimizer shards.
#include "actors/train/run_context.hpp"

#include "core/log.hpp"
#include "optim/grad_clip.hpp"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

namespace dsa::train {

bool checkpoint_due(const run_context& ctx, std::uint32_t step) {
  const auto& cp = ctx.rc.checkpoint;
  return cp.save_interval > 0 && (step + 1) % static_cast<std::uint32_t>(cp.save_interval) == 0;
}

step_decision decide_step(run_context& ctx, std::uint32_t step,
                          const std::vector<step_contribution>& all) {
  auto& st = ctx.decisions;
  double total = 0.0;
  bool overflow = false;
  for (const auto& c : all) {
    total += c.sum_of_squares;
    overflow = overflow || c.overflow;
  }
  overflow = overflow || !std::isfinite(total);
  step_decision d;
  d.loss_scale = st.scaling ? st.scaler.scale() : 1.0;
  if (st.scaling) {
    auto u = st.scaler.update(overflow);
    if (!u)
      throw std::runtime_error(u.err().message);
    d.skip = u->skip_step;
  } else if (overflow) {
    log_warn("step {}: non-finite gradients without loss scaling; step skipped", step);
    d.skip = true;
  }
  d.scaled_norm = std::sqrt(total);
  d.lr = st.schedule ? st.schedule->lr() : st.base_lr;
  if (d.skip) {
    ++st.skipped;
  } else {
    d.grad_scale = 1.0 / optim::combined_unscale_clip(d.scaled_norm, d.loss_scale, st.clip);
    if (st.schedule) {
      if (auto b = st.schedule->momentum()) {
        d.set_betas = true;
        d.beta1 = b->beta1;
        d.beta2 = b->beta2;
      }
      st.schedule->step();
    }
  }
  ctx.shared.loss_scale = st.scaling ? st.scaler.scale() : 1.0;
  d.lr_after = st.schedule ? st.schedule->lr() : st.base_lr;
  d.loss_scale_after = ctx.shared.loss_scale;
  d.save_state = checkpoint_due(ctx, step);
  return d;
}

// A shard's own decision when nothing needs the other stages (decision_scope::local):
// no clipping and no loss scaling; the schedule replicas advance identically.
step_decision decide_local(run_context& ctx, std::uint32_t shard, std::uint32_t step,
                           const step_contribution& c) {
  if (c.overflow)
    throw std::runtime_error(
        fmt::format("non-finite gradients in step {} (without loss scaling or clipping; enable "
                    "fp16 loss scaling or gradient_clipping)",
                    step));
  optim::lr_schedule* schedule = shard == 0 ? ctx.decisions.schedule.get()
                                 : ctx.decisions.replicas.empty()
                                     ? nullptr
                                     : ctx.decisions.replicas[shard - 1].get();
  step_decision d;
  d.scaled_norm = std::sqrt(c.sum_of_squares);
  d.lr = schedule ? schedule->lr() : ctx.decisions.base_lr;
  if (schedule) {
    if (auto b = schedule->momentum()) {
      d.set_betas = true;
      d.beta1 = b->beta1;
      d.beta2 = b->beta2;
    }
    schedule->step();
  }
  d.lr_after = schedule ? schedule->lr() : ctx.decisions.base_lr;
  d.save_state = checkpoint_due(ctx, step);
  return d;
}

} // namespace dsa::train
