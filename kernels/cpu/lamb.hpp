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

// One tensor: param, m, v updated in place; grad read. work: (n) f32 scratch.
// half_out as in adam_update. Returns the trust ratio applied (for logging).
float lamb_update(float* param, float* m, float* v, const float* grad, float* work, std::uint16_t* half_out,
                  dtype half_type, const lamb_params& params, std::int64_t n);

float lamb_update_ref(float* param, float* m, float* v, const float* grad, const lamb_params& params,
                      std::int64_t n);

} // namespace dsa::cpu
