// 1-bit LAMB (DeepSpeed's OnebitLamb; ../shared/reference/deepspeed-notes.md §6.5) on one
// rank's parameters, given as tensors laid end to end in one flat f32 buffer. Warm-up:
// LAMB on gradients the caller averaged over the ranks (no bias correction, as DeepSpeed,
// unless bias_correction asks for it: m / (1 - beta1^t), v / (1 - beta2^k) with k the
// warm-up steps, the fresh variance starting from the corrected one), each
// tensor's trust coefficient clamped to [min_coeff, max_coeff] and averaged into a frozen
// coefficient with coeff_beta. From freeze_step on: the variance frozen, each tensor's
// momentum scaled to a common RMS (scalings fixed at the first compressed step) and ONE
// compressed exchange of the whole momentum buffer, then masked; a fresh variance from the
// implied averaged gradient gives each tensor a factor (clamped to [factor_min,
// factor_max] and to within factor_threshold of its last value) on its frozen coefficient.
#pragma once

#include "core/error.hpp"
#include "optim/compressed_state.hpp"

#include <cstdint>
#include <functional>
#include <vector>

namespace dsa::optim {

struct onebit_lamb_params {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  std::int64_t freeze_step = 100000;
  float max_coeff = 10.0f, min_coeff = 0.01f;
  float coeff_beta = 0.9f;
  float factor_max = 4.0f, factor_min = 0.5f, factor_threshold = 0.1f;
  bool bias_correction = false;
};

// Replaces (count) values with their compressed average over the ranks.
using lamb_exchange = std::function<status(float* values, std::int64_t count)>;

class onebit_lamb {
public:
  // sizes: the tensors' element counts, in their order in the flat buffer.
  onebit_lamb(onebit_lamb_params params, std::vector<std::int64_t> sizes);

  bool compressed_next() const { return frozen_; }
  std::int64_t step_count() const { return step_; }
  std::int64_t numel() const { return numel_; }
  const std::vector<float>& exp_avg() const { return m_; }
  const std::vector<float>& exp_avg_sq() const { return v_; }
  const std::vector<float>& frozen_coefficients() const { return coeff_; } // per tensor
  const std::vector<float>& last_factors() const { return factor_; }       // per tensor
  status set_mask(std::vector<float> mask);
  void set_lr(float lr) { p_.lr = lr; }
  // The betas of the next steps (a momentum schedule's, e.g. OneCycle's cycle_momentum).
  void set_betas(float beta1, float beta2) { p_.beta1 = beta1, p_.beta2 = beta2; }
  // For checkpoints: extra "coeff" (the frozen coefficients), "factor", "scaling" (empty
  // before the first compressed step) and "exp_avg_sq_fresh" (empty while warming up).
  compressed_state save() const;
  status load(const compressed_state& state);

  status step(float* param, const float* grad, const lamb_exchange& exchange);

private:
  void warm_up(float* param, const float* grad);
  status compressed(float* param, const float* grad, const lamb_exchange& exchange);

  onebit_lamb_params p_;
  std::vector<std::int64_t> sizes_, offsets_;
  std::int64_t numel_ = 0;
  std::vector<float> m_, v_, v_fresh_, mask_;
  std::vector<float> coeff_, factor_, scaling_; // per tensor
  std::int64_t step_ = 0;
  bool frozen_ = false;
  float correction1() const; // 1 / (1 - beta1^step), or 1
  float correction2() const; // 1 / sqrt(1 - beta2^warm-up steps), or 1
};

} // namespace dsa::optim
