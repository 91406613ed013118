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

} // namespace dsa::cuda
