// GELU (erf form) and tanh. The loops are plain elementwise code that the
// compiler vectorizes where it can (std::erf / std::tanh are scalar libm
// calls); buffers above a threshold are split across OpenMP threads.
#include "kernels/cpu/activation.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cmath>

namespace dsa::cpu {
namespace {

// Below this many elements one thread does the whole buffer.
constexpr std::int64_t parallel_threshold = std::int64_t{1} << 15;
constexpr std::int64_t chunk_elements = std::int64_t{1} << 13;

template <class Fn>
void for_chunks(std::int64_t n, Fn fn) {
  DSA_CHECK(n >= 0, "activation: n = {}", n);
  if (n < parallel_threshold) {
    fn(std::int64_t{0}, n);
    return;
  }
  const std::int64_t chunks = (n + chunk_elements - 1) / chunk_elements;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < chunks; ++i) {
    const std::int64_t begin = i * chunk_elements;
    fn(begin, std::min(n, begin + chunk_elements));
  }
}

constexpr double inv_sqrt2 = 0.70710678118654752440;
constexpr double inv_sqrt_2pi = 0.39894228040143267794;

} // namespace

void gelu_forward(float* y, const float* x, std::int64_t n) {
  for_chunks(n, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const float v = x[i];
      y[i] = 0.5f * v * (1.0f + std::erf(v * static_cast<float>(inv_sqrt2)));
    }
  });
}

// gelu'(x) = Phi(x) + x * phi(x), with Phi the normal CDF and phi its density.
void gelu_backward(float* dx, const float* dy, const float* x, std::int64_t n) {
  for_chunks(n, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const float v = x[i];
      const float cdf = 0.5f * (1.0f + std::erf(v * static_cast<float>(inv_sqrt2)));
      const float pdf = static_cast<float>(inv_sqrt_2pi) * std::exp(-0.5f * v * v);
      dx[i] = dy[i] * (cdf + v * pdf);
    }
  });
}

void tanh_forward(float* y, const float* x, std::int64_t n) {
  for_chunks(n, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) y[i] = std::tanh(x[i]);
  });
}

void tanh_backward(float* dx, const float* dy, const float* y, std::int64_t n) {
  for_chunks(n, [&](std::int64_t b, std::int64_t e) {
#pragma omp simd
    for (std::int64_t i = b; i < e; ++i) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
  });
}

void gelu_forward_ref(float* y, const float* x, std::int64_t n) {
  DSA_CHECK(n >= 0, "gelu_forward_ref: n = {}", n);
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    y[i] = static_cast<float>(0.5 * v * (1.0 + std::erf(v * inv_sqrt2)));
  }
}

void gelu_backward_ref(float* dx, const float* dy, const float* x, std::int64_t n) {
  DSA_CHECK(n >= 0, "gelu_backward_ref: n = {}", n);
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double cdf = 0.5 * (1.0 + std::erf(v * inv_sqrt2));
    const double pdf = inv_sqrt_2pi * std::exp(-0.5 * v * v);
    dx[i] = static_cast<float>(static_cast<double>(dy[i]) * (cdf + v * pdf));
  }
}

} // namespace dsa::cpu
