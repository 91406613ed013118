// GELU (erf form, as BERT) per element, shared by CPU tests and CUDA kernels.
// Uses the C math functions (erff, expf), which CUDA provides on the device too.
#pragma once

#include "kernels/common/host_device.hpp"

#include <math.h>

namespace dsa::common {

constexpr float gelu_inv_sqrt2 = 0.70710678118654752440f;
constexpr float gelu_inv_sqrt_2pi = 0.39894228040143267794f;

// gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)).
DSA_HD float gelu_value(float x) {
  const float half_x = 0.5f * x;
  return fmaf(half_x, erff(x * gelu_inv_sqrt2), half_x);
}

// gelu'(x) = Phi(x) + x phi(x), phi the standard normal density.
DSA_HD float gelu_derivative(float x) {
  const float cdf = fmaf(0.5f, erff(x * gelu_inv_sqrt2), 0.5f);
  const float pdf = gelu_inv_sqrt_2pi * expf(-0.5f * x * x);
  return fmaf(x, pdf, cdf);
}

// The fused bias + GELU of the BERT intermediate layer: y = gelu(x + bias).
DSA_HD float bias_gelu_forward_element(float x, float bias) {
  return gelu_value(x + bias);
}

// dx = dy * gelu'(x + bias); the bias gradient is the column sum of dx.
DSA_HD float bias_gelu_backward_element(float dy, float x, float bias) {
  return dy * gelu_derivative(x + bias);
}

} // namespace dsa::common
