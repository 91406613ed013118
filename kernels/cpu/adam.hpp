// Fused Adam / AdamW with DeepSpeed's update rule, one pass over param, grad, m, v.
#pragma once

#include "core/dtype.hpp"
#include "kernels/cpu/isa.hpp"
#include "kernels/common/adam_math.hpp"

#include <cstdint>

namespace dsa::cpu {

enum class adam_mode : std::uint8_t {
  adam,  // L2: g += weight_decay * p before the moments
  adamw, // decoupled: p -= lr * weight_decay * p before the update
};
enum class bias_correction : std::uint8_t { on, off };

struct adam_params {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  adam_mode mode = adam_mode::adamw;
  bias_correction correction = bias_correction::on;
  std::int64_t step = 1; // 1-based step number after increment
};

// Per element:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   den = sqrt(v) / sqrt(1 - b2^t) + eps   (eps after the bias-corrected sqrt)
//   p += -lr / (1 - b1^t) * m / den        (bias factors are 1 when correction is off)
// param, m, v: (n) f32, updated in place; grad: (n) f32.
// half_out: (n) f16/bf16 copy of the updated param written in the same pass, or null.
void adam_update(float* param, float* m, float* v, const float* grad, std::uint16_t* half_out,
                 dtype half_type, const adam_params& params, std::int64_t n);

// The same on a given vector path (kernels/cpu/isa.hpp; at most the CPU's best). Every path
// gives the same bits: each performs common::adam_element's operations (explicit FMAs).
void adam_update(isa path, float* param, float* m, float* v, const float* grad, std::uint16_t* half_out,
                 dtype half_type, const adam_params& params, std::int64_t n);

// The f32 constants of one call (shared with the CUDA kernel).
common::adam_consts make_adam_consts(const adam_params& params);

// Reference: double arithmetic per element, same contract (no half copy).
void adam_update_ref(float* param, float* m, float* v, const float* grad, const adam_params& params,
                     std::int64_t n);

} // namespace dsa::cpu
