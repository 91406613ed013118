// LayerNorm over the last dimension (BERT: eps 1e-12), forward and backward.
#pragma once

#include "core/dtype.hpp"
#include "core/philox.hpp"
#include "kernels/cpu/isa.hpp"

#include <cstdint>

namespace dsa::cpu {

// y, x: (rows, c); gamma, beta: (c); mean, rstd: (rows), written when non-null.
// y = (x - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps), biased variance.
// y may alias x.
void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* gamma,
                       const float* beta, float eps, std::int64_t rows, std::int64_t c);

// A transformer sublayer's exit in one pass over its rows (bias + dropout + residual +
// LayerNorm): s = residual + dropout(product + bias), the dropout drawing element r*c + j of
// `stream` at rate p, then y = LayerNorm(s) with gamma, beta and eps (skipped when gamma is
// null). Outputs, null when not wanted: sum (s in f32; may alias product, not residual),
// sum_half (s rounded to half_type, f16 or bf16), y (f32, needed with gamma), y_half,
// mean and rstd. The bits of bias_add, dropout_residual_forward, layernorm_forward and casts
// of their results, on the same path.
struct residual_layernorm_args {
  const float* product = nullptr;
  const float* bias = nullptr;
  const float* residual = nullptr;
  float p = 0.0f;
  philox_stream stream;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  float eps = 1e-12f;
  float* sum = nullptr;
  std::uint16_t* sum_half = nullptr;
  float* y = nullptr;
  std::uint16_t* y_half = nullptr;
  float* mean = nullptr;
  float* rstd = nullptr;
  dtype half_type = dtype::bf16;
};
void residual_layernorm_forward(isa path, const residual_layernorm_args& a, std::int64_t rows, std::int64_t c);

// From the saved input: dx = (overwrite), dgamma += , dbeta += .
// dy, x, dx: (rows, c); mean, rstd: (rows). dx may alias dy.
void layernorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                        const float* mean, const float* rstd, const float* gamma, std::int64_t rows,
                        std::int64_t c);

// layernorm_backward with the saved input as stored (f32, f16 or bf16; each row widened as
// it is read) and, when `dropped` is given, the gradient of a dropout that fed this
// LayerNorm's input in the same pass: dropped = dropout(dx) at rate p, element r*c + j of
// `stream` (a post-LN sublayer's residual branch). The bits of widening x, layernorm_backward
// and dropout_forward on dx. dx may alias dy; dropped may not alias dx or dy.
struct layernorm_backward_args {
  float* dx = nullptr;
  float* dgamma = nullptr;
  float* dbeta = nullptr;
  const float* dy = nullptr;
  const void* x = nullptr;
  dtype x_type = dtype::f32;
  const float* mean = nullptr;
  const float* rstd = nullptr;
  const float* gamma = nullptr;
  float* dropped = nullptr;
  float p = 0.0f;
  philox_stream stream;
};
void layernorm_backward(isa path, const layernorm_backward_args& a, std::int64_t rows, std::int64_t c);

// Invertible form (normalize_invertible): uses the output y instead of x.
// xhat = (y - beta) / gamma; needs gamma without zeros. Same outputs as above.
void layernorm_backward_from_output(float* dx, float* dgamma, float* dbeta, const float* dy,
                                    const float* y, const float* rstd, const float* gamma,
                                    const float* beta, std::int64_t rows, std::int64_t c);
void layernorm_backward_from_output(isa path, float* dx, float* dgamma, float* dbeta, const float* dy,
                                    const float* y, const float* rstd, const float* gamma,
                                    const float* beta, std::int64_t rows, std::int64_t c);

// References: double precision loops, same contracts.
// The two on a given path (at most the CPU's best): avx512 runs loops compiled for 16-lane
// vectors; scalar and avx2 run the build's loops (AVX2 when built for it).
void layernorm_forward(isa path, float* y, float* mean, float* rstd, const float* x, const float* gamma,
                       const float* beta, float eps, std::int64_t rows, std::int64_t c);
void layernorm_backward(isa path, float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                        const float* mean, const float* rstd, const float* gamma, std::int64_t rows,
                        std::int64_t c);

void layernorm_forward_ref(float* y, float* mean, float* rstd, const float* x, const float* gamma,
                           const float* beta, float eps, std::int64_t rows, std::int64_t c);
void layernorm_backward_ref(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                            const float* mean, const float* rstd, const float* gamma,
                            std::int64_t rows, std::int64_t c);

} // namespace dsa::cpu
