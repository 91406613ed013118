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
#include "optim/compressed_state.hpp"

#include <cstdint>
#include <functional>
#include <vector>

namespace dsa::optim {

struct zeroone_adam_params {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  std::int64_t var_freeze_step = 100000;
  std::int64_t var_update_scaler = 16;   // κ
  std::int64_t local_step_scaler = 32678;
  std::int64_t local_step_clipper = 16;  // H
  bool bias_correction = false;
};

// Replaces (count) values with their compressed average over the ranks; reset_errors: zero
// the exchange's error buffers first.
using compressed_exchange = std::function<status(float* values, std::int64_t count, bool reset_errors)>;

class zeroone_adam {
public:
  zeroone_adam(zeroone_adam_params params, std::int64_t numel);

  // Whether the next step wants the gradient averaged over the ranks in full precision
  // (DeepSpeed turns the engine's allreduce on for it); otherwise this rank's own.
  bool full_gradient_next() const;
  std::int64_t step_count() const { return step_; }
  std::int64_t var_interval() const { return var_interval_; }
  std::int64_t local_step_interval() const { return local_interval_; }
  const std::vector<float>& exp_avg() const { return m_; }
  const std::vector<float>& exp_avg_sq() const { return v_; }
  // exp_avg_mask (empty: none; else numel values multiplying every exchanged tensor).
  status set_mask(std::vector<float> mask);
  void set_lr(float lr) { p_.lr = lr; }
  // The betas of the next steps (a momentum schedule's, e.g. OneCycle's cycle_momentum).
  void set_betas(float beta1, float beta2) { p_.beta1 = beta1, p_.beta2 = beta2; }
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

  zeroone_adam_params p_;
  std::int64_t numel_;
  std::vector<float> m_, v_, u_, mask_;
  std::vector<float> anchor_; // phase B: the parameters at the last synchronisation
  float lrs_ = 0;
  std::int64_t step_ = 0;
  std::int64_t var_interval_ = 1, var_counter_ = 0, var_updates_ = 0;
  float correction1() const; // 1 / (1 - beta1^step), or 1
  float correction2() const; // 1 / sqrt(1 - beta2^var_updates), or 1
  std::int64_t local_interval_ = 1, local_counter_ = 0;
  bool errors_reset_ = false;
};

} // namespace dsa::optim
