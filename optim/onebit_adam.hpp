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
#include "optim/compressed_state.hpp"

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace dsa::optim {

struct onebit_adam_params {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
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
// freeze_step, but at least one warm-up step always runs (freeze_step 0 behaves as 1), and
// after a dummy first step too (as DeepSpeed, whose initialization step leaves its
// optimizer warming up: freeze_step 0 or 1 then behaves as 2).
inline std::int64_t first_local_step(std::int64_t freeze_step, bool dummy_first_step) {
  const std::int64_t least = dummy_first_step ? 2 : 1;
  return freeze_step < least ? least : freeze_step;
}
// Steps of the first `step` that updated the variance: warm-up steps before freeze_step,
// less the dummy first step.
std::int64_t variance_steps(const onebit_adam_params& p, std::int64_t step);
} // namespace onebit_math

// Replaces (count) values with their compressed average over the ranks.
using momentum_exchange = std::function<status(float* values, std::int64_t count)>;

class onebit_adam {
public:
  onebit_adam(onebit_adam_params params, std::int64_t numel);

  // Whether the next step runs compressed: its gradient must be this rank's own, not averaged.
  bool compressed_next() const { return frozen_; }
  std::int64_t step_count() const { return step_; }
  const std::vector<float>& exp_avg() const { return m_; }
  const std::vector<float>& exp_avg_sq() const { return v_; }
  // exp_avg_mask: multiplies the momentum after every compressed exchange (1 keeps, 0
  // zeroes); empty: none. Its size must be numel.
  status set_mask(std::vector<float> mask);
  // The learning rate of the next steps (a schedule's).
  void set_lr(float lr) { p_.lr = lr; }
  // The betas of the next steps (a momentum schedule's, e.g. OneCycle's cycle_momentum).
  void set_betas(float beta1, float beta2) { p_.beta1 = beta1, p_.beta2 = beta2; }
  // For checkpoints; load re-derives the phase from the step count, as DeepSpeed does.
  compressed_state save() const;
  status load(const compressed_state& state);

  // One step of param (numel) with grad (numel). exchange runs once per compressed step
  // (and on a dummy first step). An error from it fails the step, leaving the parameters
  // unchanged but the momentum possibly half exchanged: the run must stop.
  status step(float* param, const float* grad, const momentum_exchange& exchange);

private:
  onebit_adam_params p_;
  std::int64_t numel_;
  std::vector<float> m_, v_, mask_;
  std::int64_t step_ = 0, var_steps_ = 0;
  bool frozen_ = false;
};

} // namespace dsa::optim
