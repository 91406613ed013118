// The Adam / AdamW element update shared by the CPU kernel (its scalar tail) and the
// CUDA kernel: same operations in the same order with explicit fma, so an element gets
// the same bits on either side when both round the same way.
#pragma once

#include "kernels/common/host_device.hpp"

#include <math.h>

namespace dsa::common {

// Per-call constants in f32, computed once on the host (kernels/cpu/adam.hpp:
// make_adam_consts).
struct adam_consts {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps;
  float step_size;    // -lr / (1 - beta1^t), or -lr without bias correction
  float bias2_factor; // 1 / sqrt(1 - beta2^t), or 1
  float l2_decay;     // weight_decay in L2 mode, else 0
  float decoupled;    // -lr * weight_decay in AdamW mode, else 0
};

// One element: param, m, v updated in place from gradient g.
DSA_HD void adam_element(float& param, float& m, float& v, float g, const adam_consts& c) {
  float p = param;
  g = fmaf(p, c.l2_decay, g);
  const float mm = fmaf(g, c.one_minus_beta1, c.beta1 * m);
  const float vv = fmaf(g * g, c.one_minus_beta2, c.beta2 * v);
  const float den = fmaf(sqrtf(vv), c.bias2_factor, c.eps);
  p = fmaf(p, c.decoupled, p);
  p = fmaf(mm / den, c.step_size, p);
  m = mm;
  v = vv;
  param = p;
}

// Loss-scaler support: true when x is neither inf nor NaN (exponent bits not all ones).
DSA_HD bool is_finite_value(float x) {
  return isfinite(x);
}

} // namespace dsa::common
