// 0/1 Adam (DeepSpeed's ZeroOneAdam; ../shared/reference/deepspeed-notes.md §6.4) on one
// rank's flat f32 parameters. Phase A (steps up to var_freeze_step), adaptive variance
// freezing: on steps k with k % var_interval == 0 the caller averages the gradient over the
// ranks in full precision and the variance and momentum update from it; on the others the
// gradient is exchanged compressed and only the momentum updates; var_interval doubles
// after every var_update_scaler variance updates. Phase B, 1-bit synchronisation with local
// steps: the gradient stays local, each step moves the parameters and accumulates the move
// in u; every local_step_interval steps the ranks roll back, exchange u (in momentum units)
// compressed, rebuild the momentum as the lr-weighted average move and apply it together;
// the interval doubles every local_step_scaler steps up to local_step_clipper.
//
// As DeepSpeed: weight decay inside the update, no bias correction unless bias_correction
// (which DeepSpeed ignores) asks for it here: m / (1 - beta1^t), v / (1 - beta2^k) with k the
// variance updates so far (the rebuilt momentum divided by the same factor), and the exchange's
// error buffers zeroed once on entering phase B (they held gradients, then hold u). Unlike
// DeepSpeed, a synchronisation restores the parameters from a copy taken at the previous
// one instead of subtracting the accumulated move (which rounds differently on each rank),
// so the ranks stay identical bit for bit; it costs one more copy of the parameters.
#pragma once

#include "core/error.hpp"
#include "optim/compressed_optimizer.hpp"

#include <cstdint>
#include <functional>
#include <vector>

namespace dsa::optim {

struct zeroone_adam_params : compressed_params {
  std::int64_t var_freeze_step = 100000;
  std::int64_t var_update_scaler = 16;   // κ
  std::int64_t local_step_scaler = 32678;
  std::int64_t local_step_clipper = 16;  // H
  bool bias_correction = false;
  // DeepSpeed's initialization step: step 1 only counts and exchanges zeros once (no
  // update); the schedule's counters start at step 2, its step numbers count step 1.
  bool dummy_first_step = false;
};

// 0/1 Adam's step schedule: which steps average full gradients and update the variance
// (phase A), which synchronise (phase B), and the intervals' growth. Shared by
// optim::zeroone_adam and the ZeRO partition's 0/1 Adam (partitioned_optimizer::step_onebit),
// which must take the same steps.
// The last phase-A step: var_freeze_step as last_full_precision_step takes it (DeepSpeed's
// optimizer leaves its variance phase only after a step that ran in it).
inline std::int64_t last_variance_step(const zeroone_adam_params& p) {
  return last_full_precision_step(p.var_freeze_step, p.dummy_first_step);
}

struct zeroone_schedule {
  std::int64_t var_interval = 1, var_counter = 0, var_updates = 0;
  std::int64_t local_interval = 1, local_counter = 0;

  // Whether step k (1-based) averages full gradients and updates the variance.
  bool full(const zeroone_adam_params& p, std::int64_t k) const {
    return k <= last_variance_step(p) && k % var_interval == 0;
  }
  // Whether phase-B step k synchronises the ranks.
  bool syncs(std::int64_t k) const { return k % local_interval == 0; }
  // Before step k's update: counts its variance update.
  void begin(const zeroone_adam_params& p, std::int64_t k) {
    if (full(p, k)) ++var_updates;
  }
  // After step k's update: the intervals grow.
  void end(const zeroone_adam_params& p, std::int64_t k);
  // The schedule after steps 1..k (a resume).
  static zeroone_schedule after(const zeroone_adam_params& p, std::int64_t k);
};

// 0/1 Adam's element-wise arithmetic on n values, the same for the whole parameters and
// for a ZeRO partition's pieces (so the two are equal bit for bit). a1, a2: the bias
// corrections (1 without bias_correction).
namespace zeroone_math {
float correction1(const zeroone_adam_params& p, std::int64_t step);
float correction2(const zeroone_adam_params& p, std::int64_t var_updates);
// Phase A's variance step: v and m from the full-precision average.
void full_moments(float* m, float* v, const float* g, std::int64_t n, float beta1, float beta2);
void momentum(float* m, const float* g, std::int64_t n, float beta1);
// Phase A's update: param -= lr (a1 m / (sqrt(v) a2 + eps) + decay param).
void update(float* param, const float* m, const float* v, std::int64_t n, const zeroone_adam_params& p, float decay,
            float a1, float a2);
// A phase-B local step: the same move, also accumulated (negated) in u.
void local_move(float* param, const float* m, const float* v, float* u, std::int64_t n, const zeroone_adam_params& p,
                float decay, float a1, float a2);
// u in momentum units before the exchange: u *= sqrt(v) a2 + eps.
void to_momentum_units(float* u, const float* v, std::int64_t n, float eps, float a2);
// After it: m rebuilt as the lr-weighted average move (lrs: the interval's learning rates
// summed), param = anchor + u / (sqrt(v) a2 + eps), anchor = param.
void rebuild_momentum(float* m, const float* u, std::int64_t n, float lrs, float a1);
void resync(float* param, float* anchor, const float* u, const float* v, std::int64_t n, float eps, float a2);
} // namespace zeroone_math

// Replaces (count) values with their compressed average over the ranks; reset_errors: zero
// the exchange's error buffers first.
using compressed_exchange = std::function<status(float* values, std::int64_t count, bool reset_errors)>;

// exp_avg_mask (set_mask) multiplies every exchanged tensor.
class zeroone_adam : public compressed_optimizer<zeroone_adam_params> {
public:
  zeroone_adam(zeroone_adam_params params, std::int64_t numel);

  // Whether the next step wants the gradient averaged over the ranks in full precision
  // (DeepSpeed turns the engine's allreduce on for it); otherwise this rank's own.
  bool full_gradient_next() const;
  std::int64_t var_interval() const { return sched_.var_interval; }
  std::int64_t local_step_interval() const { return sched_.local_interval; }
  // For checkpoints; load replays the schedule's intervals and counters up to the step
  // count and starts the momentum accumulator, anchor and learning-rate sum afresh.
  compressed_state save() const;
  status load(const compressed_state& state);

  // One step; returns whether it synchronised the ranks (a full-gradient or compressed
  // exchange in phase A, a sync in phase B): after such a step every rank holds the same
  // parameters and momentum.
  expected<bool> step(float* param, const float* grad, const compressed_exchange& exchange);

private:
  void masked(float* values) const;

  std::vector<float> u_;
  std::vector<float> anchor_; // phase B: the parameters at the last synchronisation
  float lrs_ = 0;
  zeroone_schedule sched_;
  bool errors_reset_ = false;
};

} // namespace dsa::optim
