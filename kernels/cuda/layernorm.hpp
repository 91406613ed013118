// LayerNorm over the last dimension on the GPU: one block per row, Welford statistics
// merged across the block with the shared math (kernels/common/layernorm_math.hpp).
// Launchers check sizes, run on the given stream, and return the launch status.
#pragma once

#include "kernels/cuda/elem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::cuda {

// y, x: (rows, c) of `type`; gamma, beta: (c) f32; mean, rstd: (rows) f32, always written.
// y = (x - mean) * rstd * gamma + beta with biased variance; y may alias x.
cudaError_t layernorm_forward(void* y, float* mean, float* rstd, const void* x, const float* gamma,
                              const float* beta, float eps, elem type, std::int64_t rows,
                              std::int64_t c, cudaStream_t stream);

// From the saved input: dx (overwrite), dgamma += , dbeta += (f32 atomics, so the
// summation order over rows varies run to run; either may be null: not wanted, as the
// deterministic mode's ordered sums, ordered_sums.hpp, take their place). dy, x, dx:
// (rows, c) of `type`; mean, rstd: (rows) f32; gamma, dgamma, dbeta: (c) f32. dx may alias dy.
cudaError_t layernorm_backward(void* dx, float* dgamma, float* dbeta, const void* dy, const void* x,
                               const float* mean, const float* rstd, const float* gamma, elem type,
                               std::int64_t rows, std::int64_t c, cudaStream_t stream);

} // namespace dsa::cuda
