// LAMB (You et al. 2019) as DeepSpeed's FusedLamb: Adam direction plus weight
// decay, scaled per tensor by a trust ratio ||p|| / ||update|| clamped to
// [min_coeff, max_coeff].
#pragma once

#include "core/dtype.hpp"
#include "kernels/cpu/adam.hpp"

#include <cstdint>

namespace dsa::cpu {

struct lamb_params {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float max_coeff = 10.0f;
  float min_coeff = 0.01f;
  bias_correction correction = bias_correction::on;
  std::int64_t step = 1;
};

// Per tensor (DeepSpeed FusedLamb, default eps_inside_sqrt=False, csrc/lamb/fused_lamb_cuda_kernel.cu):
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   m_hat = m / (1 - b1^t);  v_hat = v / (1 - b2^t)     (both divisors 1 when correction is off)
//   u = m_hat / (sqrt(v_hat) + eps) + weight_decay * p  (eps after the sqrt; decay on p before the update)
//   w = ||p||_2, r = ||u||_2 over the whole tensor (p before the update)
//   coeff = 1 if w == 0 or r == 0, else clamp(w / r, min_coeff, max_coeff)
//   p -= lr * coeff * u
// Older DeepSpeed (before m and v were bias-corrected themselves) used u = m / (sqrt(v) + eps) + wd p
// and folded lr sqrt(1-b2^t) / (1-b1^t) into the step size; we follow the current kernel.
// There is no gradient-clipping or grad_scale input: grads arrive already unscaled (grad_clip.hpp).
//
// One tensor: param, m, v updated in place; grad read. work: (n) f32 scratch.
// half_out as in adam_update. Returns the trust ratio applied (for logging).
float lamb_update(float* param, float* m, float* v, const float* grad, float* work, std::uint16_t* half_out,
                  dtype half_type, const lamb_params& params, std::int64_t n);

// The same update in three phases, for a tensor whose elements are spread over several
// owners (a ZeRO partition holds pieces of tensors). The norms are sums over fixed blocks of
// lamb_norm_block elements counted from the tensor's first element: each block is summed on
// its own, then the block sums are added in block order (lamb_norm_totals). lamb_update
// sums the same way, so a piece that starts on a block boundary of its tensor yields exactly
// the block sums the whole tensor would, and the owners, once they have every block's sums,
// get the whole tensor's trust ratio bit for bit.
inline constexpr std::int64_t lamb_norm_block = 2048;
inline std::int64_t lamb_norm_blocks(std::int64_t n) { return (n + lamb_norm_block - 1) / lamb_norm_block; }

// Pass one over n elements starting on a norm-block boundary: m, v updated in place; work = u;
// block_sums: (2 * lamb_norm_blocks(n)), = {sum p^2, sum u^2} of each block (p before the update).
// work may be grad itself (each element is read before it is written), not partly overlap it.
void lamb_first_pass(float* m, float* v, float* work, double* block_sums, const float* param, const float* grad,
                     const lamb_params& params, std::int64_t n);
// Adds block sums in block order, starting from the given totals (0 for a whole tensor):
// totals[0] += sum p^2, totals[1] += sum u^2. block_sums: (2 * blocks).
void lamb_norm_totals(double totals[2], const double* block_sums, std::int64_t blocks);
// The trust ratio lamb_update applies, from a whole tensor's totals.
float lamb_trust_ratio(double sum_p2, double sum_u2, const lamb_params& params);
// Pass two: param -= lr * coeff * work, in place; the half copy as in lamb_update. work: (n).
void lamb_second_pass(float* param, std::uint16_t* half_out, const float* work, dtype half_type, float coeff,
                      const lamb_params& params, std::int64_t n);

// The same on a given vector path (kernels/cpu/isa.hpp; at most the CPU's best). AVX2 and
// AVX-512 give the same bits; the scalar path's norms differ from theirs in the last bits.
float lamb_update(isa path, float* param, float* m, float* v, const float* grad, float* work,
                  std::uint16_t* half_out, dtype half_type, const lamb_params& params, std::int64_t n);
void lamb_first_pass(isa path, float* m, float* v, float* work, double* block_sums, const float* param,
                     const float* grad, const lamb_params& params, std::int64_t n);
void lamb_second_pass(isa path, float* param, std::uint16_t* half_out, const float* work, dtype half_type,
                      float coeff, const lamb_params& params, std::int64_t n);

float lamb_update_ref(float* param, float* m, float* v, const float* grad, const lamb_params& params,
                      std::int64_t n);

} // namespace dsa::cpu
