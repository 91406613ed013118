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

float lamb_update_ref(float* param, float* m, float* v, const float* grad, const lamb_params& params,
                      std::int64_t n);

} // namespace dsa::cpu
