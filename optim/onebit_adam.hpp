// 1-bit Adam (DeepSpeed's OnebitAdam; ../shared/reference/deepspeed-notes.md §6.3) on one
// rank's flat f32 parameters: full-precision Adam while warming up, on gradients the caller
// averaged over the ranks; from freeze_step on the variance is frozen, the gradients stay
// local, and the momentum is exchanged compressed (an exchange the caller supplies, e.g.
// net::compressed_allreduce with this rank's error buffers), then masked.
//
// DeepSpeed's update: weight decay added to the update, update = m / (sqrt(v) + eps)
// (+ wd * p), p -= lr * update, with no bias correction: DeepSpeed ignores its
// bias_correction flag. Here the flag is honoured when set: m / (1 - beta1^t) and v / (1 -
// beta2^k), k the variance updates so far (frozen with the variance); false is DeepSpeed's
// arithmetic exactly.
// With dummy_first_step the first call only counts the step and runs the exchange once
// (DeepSpeed's initialization step, which discards that step's gradient).
#pragma once

#include "core/error.hpp"
#include "optim/compressed_optimizer.hpp"

#include <cstdint>
#include <utility>
#include <vector>

namespace dsa::optim {

struct onebit_adam_params : compressed_params {
  std::int64_t freeze_step = 100000;
  bool dummy_first_step = false;
  bool bias_correction = false;
};

// 1-bit Adam's element-wise arithmetic, shared by onebit_adam (whole parameters) and
// partitioned_optimizer (a ZeRO partition), so both give the same bits. Compiled once here:
// the same code path, the same floating-point contractions.
namespace onebit_math {
// Warm-up: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2 over n elements.
void warm_moments(float* m, float* v, const float* g, std::int64_t n, float beta1, float beta2);
// Compressed phase, before the exchange: m = b1 m + (1 - b1) g.
void local_momentum(float* m, const float* g, std::int64_t n, float beta1);
// m *= mask (exp_avg_mask, 0 or 1 per element).
void apply_mask(float* m, const float* mask, std::int64_t n);
// The bias-correction factors {a1 for m, a2 for sqrt(v)} after `step` steps of which
// `var_steps` updated the variance (1, 1 without correction).
std::pair<float, float> corrections(const onebit_adam_params& p, std::int64_t step, std::int64_t var_steps);
// p -= lr (a1 m / (sqrt(v) a2 + eps) + wd p) over n elements.
void update(float* param, const float* m, const float* v, std::int64_t n, const onebit_adam_params& p,
            float weight_decay, std::pair<float, float> corrections);
// The step count after which the gradients stay local (the first local step is the next):
// the last warm-up step, last_full_precision_step.
inline std::int64_t first_local_step(std::int64_t freeze_step, bool dummy_first_step) {
  return last_full_precision_step(freeze_step, dummy_first_step);
}
// Steps of the first `step` that updated the variance: warm-up steps before freeze_step,
// less the dummy first step.
std::int64_t variance_steps(const onebit_adam_params& p, std::int64_t step);
} // namespace onebit_math

// exp_avg_mask (set_mask) multiplies the momentum after every compressed exchange.
class onebit_adam : public compressed_optimizer<onebit_adam_params> {
public:
  onebit_adam(onebit_adam_params params, std::int64_t numel);

  // Whether the next step runs compressed: its gradient must be this rank's own, not averaged.
  bool compressed_next() const { return frozen_; }
  // For checkpoints; load re-derives the phase from the step count, as DeepSpeed does.
  compressed_state save() const;
  status load(const compressed_state& state);

  // One step of param (numel) with grad (numel). exchange runs once per compressed step
  // (and on a dummy first step). An error from it fails the step, leaving the parameters
  // unchanged but the momentum possibly half exchanged: the run must stop.
  status step(float* param, const float* grad, const momentum_exchange& exchange);

private:
  std::int64_t var_steps_ = 0;
  bool frozen_ = false;
};

} // namespace dsa::optim
