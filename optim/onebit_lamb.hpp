// 1-bit LAMB (DeepSpeed's OnebitLamb; ../shared/reference/deepspeed-notes.md §6.5) on one
// rank's parameters, given as tensors laid end to end in one flat f32 buffer (all of
// them, whatever their weight decay: DeepSpeed fuses every group's momentum). Warm-up:
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
#include "optim/compressed_optimizer.hpp"

#include <cstdint>
#include <utility>
#include <vector>

namespace dsa::optim {

struct optimizer_config;

struct onebit_lamb_params : compressed_params {
  std::int64_t freeze_step = 100000;
  float max_coeff = 10.0f, min_coeff = 0.01f;
  float coeff_beta = 0.9f;
  float factor_max = 4.0f, factor_min = 0.5f, factor_threshold = 0.1f;
  bool bias_correction = false;
  // DeepSpeed's initialization step: step 1 only counts and exchanges zeros once (no
  // update); the phase follows the step count, as 1-bit Adam's.
  bool dummy_first_step = false;
};

// 1-bit LAMB's arithmetic, shared by onebit_lamb (whole tensors) and partitioned_optimizer
// (pieces of tensors on ZeRO ranks), compiled once so both give the same bits. Norms are
// summed per block of lamb_block elements from a tensor's start (each block in order, in
// double) and the blocks' sums added in order: a piece starting on a block boundary sums
// its own blocks, and the ranks' block sums add up to the whole tensor's exactly.
namespace onebit_lamb_math {
inline constexpr std::int64_t lamb_block = 2048; // = cpu::lamb_norm_block, the layout's alignment
inline std::int64_t blocks_of(std::int64_t n) { return (n + lamb_block - 1) / lamb_block; }
// sums[k] = the sum of squares of x's block k (blocks_of(n) values).
void block_squares(const float* x, std::int64_t n, double* sums);
// sqrt of the block sums added in order.
double norm_of(const double* sums, std::int64_t blocks);
double norm(const float* x, std::int64_t n);
// u = a1 m / (sqrt(v) a2 + eps) + wd p.
void direction(float* u, const float* m, const float* v, const float* p, std::int64_t n, float a1, float a2,
               float eps, float weight_decay);
// m = (b1 m + (1 - b1) g) s: the scaled local momentum before the exchange.
void scaled_momentum(float* m, const float* g, std::int64_t n, float beta1, float scaling);
// m /= s (after the exchange).
void unscale(float* m, std::int64_t n, float scaling);
// After the exchange: the fresh variance from the implied averaged gradient (m - b1 prev) /
// (1 - b1), u0 = a1 m / den and u = u0 + wd p with den = sqrt(v) a2 + eps; returns the
// largest den / (sqrt(v_fresh) + eps), starting from `largest`.
float fresh_step(float* v_fresh, float* u0, float* u, const float* m, const float* prev, const float* v,
                 const float* p, std::int64_t n, const onebit_lamb_params& params, float a1, float a2, float largest);
// The factor from the tensor's largest ratio and, with weight decay, the norms of u0 and u;
// bounded by factor_min/max and to within factor_threshold of the last factor.
float factor(float largest, double u0_norm, double u_norm, float last, const onebit_lamb_params& params);
// The trust coefficient from the norms of p and u (1 when either is 0), clamped.
float trust(double p_norm, double u_norm, const onebit_lamb_params& params);
// p -= scale u.
void apply(float* p, const float* u, std::int64_t n, float scale);
// {a1, a2} after `step` steps: 1 / (1 - beta1^step) and 1 / sqrt(1 - beta2^k), k = the
// warm-up steps so far (min(step, onebit_math::first_local_step(...))), neither counting a
// dummy first step;
// {1, 1} without bias correction.
std::pair<float, float> corrections(const onebit_lamb_params& params, std::int64_t step);
} // namespace onebit_lamb_math

// 1-bit LAMB's one parameter group (its exchange's error buffers and checkpoint fields
// are named after it): every tensor, BERT's "decay" group first, then "no_decay".
inline constexpr const char* onebit_lamb_group = "all";

// The parameters of optimizer.type OneBitLamb at `lr`, with `weight_decay` (every tensor's,
// unless the optimizer is given each tensor's).
onebit_lamb_params onebit_lamb_params_of(const optimizer_config& cfg, double lr, double weight_decay);

// Replaces (count) values with their compressed average over the ranks.
using lamb_exchange = momentum_exchange;

// exp_avg_mask (set_mask) multiplies the momentum after every compressed exchange.
class onebit_lamb : public compressed_optimizer<onebit_lamb_params> {
public:
  // sizes: the tensors' element counts, in their order in the flat buffer; decays: each
  // tensor's weight decay (empty: params.weight_decay for all).
  onebit_lamb(onebit_lamb_params params, std::vector<std::int64_t> sizes, std::vector<float> decays = {});

  bool compressed_next() const { return frozen_; }
  std::int64_t numel() const { return numel_; }
  const std::vector<float>& frozen_coefficients() const { return coeff_; } // per tensor
  const std::vector<float>& last_factors() const { return factor_; }       // per tensor
  // For checkpoints: extra "coeff" (the frozen coefficients), "factor", "scaling" (empty
  // before the first compressed step) and "exp_avg_sq_fresh" (empty while warming up).
  compressed_state save() const;
  status load(const compressed_state& state);

  status step(float* param, const float* grad, const lamb_exchange& exchange);

private:
  void warm_up(float* param, const float* grad);
  onebit_lamb_params params_of(std::size_t t) const; // p_ with tensor t's weight decay
  status compressed(float* param, const float* grad, const lamb_exchange& exchange);

  std::vector<std::int64_t> sizes_, offsets_;
  std::vector<float> decays_; // per tensor
  std::vector<float> v_fresh_;
  std::vector<float> coeff_, factor_, scaling_; // per tensor
  bool frozen_ = false;
  void start_fresh();         // v_fresh_ = v_, bias-corrected, at the freeze
  float correction1() const; // 1 / (1 - beta1^step), or 1
  float correction2() const; // 1 / sqrt(1 - beta2^warm-up steps), or 1
};

} // namespace dsa::optim
