// The pre-LN sublayer exit without a LayerNorm, and an elementwise sum, on the GPU. The
// exit's twin is cpu::residual_layernorm_forward with only its sum wanted (what the CPU's
// pre-LN layer calls), element by element common::residual_sum_element.
#pragma once

#include "core/philox.hpp"
#include "kernels/cuda/elem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::cuda {

// y = residual + dropout(x + bias) (overwrite), in f32, rounded once to `type`: element
// i = r c + j kept iff element i of `rng` is (p == 0: all kept), kept values scaled by
// 1 / (1 - p). y, x, residual: (rows, c) of `type`; bias: (c) f32. y may alias x or residual.
// p in [0, 1); at most 2^34 elements.
cudaError_t bias_dropout_residual(void* y, const void* x, const float* bias, const void* residual, float p,
                                  const philox_stream& rng, elem type, std::int64_t rows, std::int64_t c,
                                  cudaStream_t stream);

// y += x (accumulate), the f32 sum rounded once to `type`. y, x: (n) of `type`; y may
// alias x.
cudaError_t add_into(void* y, const void* x, elem type, std::int64_t n, cudaStream_t stream);

// A LayerNorm's input from its output (normalize_invertible): per row r and column j, in
// f32, xhat = (y - beta[j]) * (1 / gamma[j]) (the CPU's layernorm_backward_from_output
// form), x = xhat / rstd[r] + mean[r], rounded to `type`. x, y: (rows, c) of `type`; x may
// alias y; mean, rstd: (rows) f32; gamma, beta: (c) f32. A zero gain has no inverse: its
// column comes out inf or NaN (the CPU refuses it; here the step's gradients are then not
// finite).
cudaError_t layernorm_invert(void* x, const void* y, const float* mean, const float* rstd, const float* gamma,
                             const float* beta, elem type, std::int64_t rows, std::int64_t c, cudaStream_t stream);

} // namespace dsa::cuda
