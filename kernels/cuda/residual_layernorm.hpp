// The fused end of a post-LN BERT sublayer on the GPU:
// y = LayerNorm(dropout(x + bias) + residual) in one pass over the row, with the mask
// drawn from the same Philox elements as the CPU (kernels/common/residual_layernorm_math.hpp).
#pragma once

#include "core/philox.hpp"
#include "kernels/cuda/elem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::cuda {

// y, sum, x, residual: (rows, c) of `type`; bias, gamma, beta: (c) f32; mean, rstd:
// (rows) f32. sum (the LayerNorm input, which backward needs) is written when non-null.
// All overwritten; y may alias residual (each element is read before it is written).
// p in [0, 1); dropout element i = r c + j of `rng`.
cudaError_t residual_layernorm_forward(void* y, void* sum, float* mean, float* rstd, const void* x,
                                       const float* bias, const void* residual, const float* gamma,
                                       const float* beta, float p, const philox_stream& rng,
                                       float eps, elem type, std::int64_t rows, std::int64_t c,
                                       cudaStream_t stream);

// The backward of the forward above, from its saved sum, mean and rstd:
//   dresidual = LayerNorm input gradient of dy (dsum; the residual's gradient), overwritten;
//   dx = dropout backward of dsum, the mask drawn again from element r c + j of `rng` and
//        kept values scaled by 1 / (1 - p) (p == 0: dx = dsum), overwritten; skipped when null;
//   dgamma += sum_r dy xhat, dbeta += sum_r dy, dbias += sum_r dx (the f32 dx before it is
//        stored); each skipped when null.
// dresidual, dx, dy, sum: (rows, c) of `type`, f32 arithmetic; mean, rstd: (rows) f32;
// gamma, dgamma, dbeta, dbias: (c) f32. dresidual may alias dy (each element is read
// before it is written); dx must alias no other argument (dx == dy or dx == dresidual is
// refused). The other pointers are required. p, rng and the size limits as in the forward;
// rows == 0 launches nothing.
// dgamma, dbeta and dbias add each row's term by an f32 atomic, so their rounding depends
// on the order rows arrive in (not bit-reproducible from run to run; sum order only).
cudaError_t residual_layernorm_backward(void* dresidual, void* dx, float* dgamma, float* dbeta,
                                        float* dbias, const void* dy, const void* sum,
                                        const float* mean, const float* rstd, const float* gamma,
                                        float p, const philox_stream& rng, elem type,
                                        std::int64_t rows, std::int64_t c, cudaStream_t stream);

} // namespace dsa::cuda
