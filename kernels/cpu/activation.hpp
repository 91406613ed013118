// Elementwise activations: GELU (erf form, as BERT) and tanh (pooler).
#pragma once

#include "core/dtype.hpp"
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

// Bias and GELU in one pass over (rows, c) rows, as a feed-forward layer's first projection
// needs: x += bias (row-wise; x keeps the pre-activation for backward), then y = gelu(x).
// The same bits as bias_add then gelu_forward.
void gelu_bias_forward(float* y, float* x, const float* bias, std::int64_t rows, std::int64_t c);
// Its gradient: dx = dy * gelu'(x) (x as gelu_bias_forward left it), and dbias += the column
// sums of dx (summed in double, rows in order). The same bits as gelu_backward then
// bias_backward. dx may alias dy.
void gelu_bias_backward(float* dx, float* dbias, const float* dy, const float* x, std::int64_t rows, std::int64_t c);
void gelu_bias_forward(isa path, float* y, float* x, const float* bias, std::int64_t rows, std::int64_t c);
// The same with both results rounded to `half` (f16 or bf16) and nothing else written:
// x_out = half(x + bias), y = half(gelu(x + bias)); x is left as it is. For a layer whose
// stash and next product take the half values only (bf16 with bf16.cpu_gemm). The same bits
// as gelu_bias_forward then cast. On `path` (at most the CPU's best).
void gelu_bias_forward_half(isa path, std::uint16_t* y, std::uint16_t* x_out, dtype half, const float* x,
                            const float* bias, std::int64_t rows, std::int64_t c);
void gelu_bias_backward(isa path, float* dx, float* dbias, const float* dy, const float* x, std::int64_t rows,
                        std::int64_t c);
// The same with x stored in f32, f16 or bf16 (a half stash read as it is, each row's slice
// widened exactly in L1): the bits of gelu_bias_backward on the widened x.
void gelu_bias_backward(isa path, float* dx, float* dbias, const float* dy, const void* x, dtype x_type,
                        std::int64_t rows, std::int64_t c);
// The same writing exactly one of dx (f32) and dx_bf16 (dx rounded to bf16, nearest even, for
// products that read bf16 only); dbias from the f32 values either way. dx_bf16 may not alias dy.
void gelu_bias_backward(isa path, float* dx, std::uint16_t* dx_bf16, float* dbias, const float* dy, const void* x,
                        dtype x_type, std::int64_t rows, std::int64_t c);
// y = tanh(x); dx = dy * (1 - y^2) from the output.
void tanh_forward(float* y, const float* x, std::int64_t n);
void tanh_backward(float* dx, const float* dy, const float* y, std::int64_t n);

void gelu_forward_ref(float* y, const float* x, std::int64_t n);
void gelu_backward_ref(float* dx, const float* dy, const float* x, std::int64_t n);

} // namespace dsa::cpu
