// Elementwise activations: GELU (erf form, as BERT) and tanh (pooler).
#pragma once

#include "kernels/cpu/isa.hpp"

#include <cstdint>

namespace dsa::cpu {

// y = x * 0.5 * (1 + erf(x / sqrt(2))); y may alias x. On active_isa()'s path.
void gelu_forward(float* y, const float* x, std::int64_t n);
// dx = dy * gelu'(x) (overwrite); dx may alias dy.
void gelu_backward(float* dx, const float* dy, const float* x, std::int64_t n);
// The same on a given path (at most the CPU's best): the AVX-512 and AVX2 paths give the
// same bits, the scalar one (no FMA) may differ by an ulp.
void gelu_forward(isa path, float* y, const float* x, std::int64_t n);
void gelu_backward(isa path, float* dx, const float* dy, const float* x, std::int64_t n);

// y = tanh(x); dx = dy * (1 - y^2) from the output.
void tanh_forward(float* y, const float* x, std::int64_t n);
void tanh_backward(float* dx, const float* dy, const float* y, std::int64_t n);

void gelu_forward_ref(float* y, const float* x, std::int64_t n);
void gelu_backward_ref(float* dx, const float* dy, const float* x, std::int64_t n);

} // namespace dsa::cpu
