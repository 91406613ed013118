// Fused bias + GELU on the GPU (the BERT intermediate layer). Launchers check sizes,
// run on the given stream, and return the launch status; no synchronization.
#pragma once

#include "kernels/cuda/elem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::cuda {

// y = gelu(x + bias) (overwrite). y, x: (rows, c) of `type`; bias: (c) f32.
// y may alias x. Arithmetic in f32 (kernels/common/gelu_math.hpp).
cudaError_t bias_gelu_forward(void* y, const void* x, const float* bias, elem type,
                              std::int64_t rows, std::int64_t c, cudaStream_t stream);

// dx = dy * gelu'(x + bias) (overwrite). dx, dy, x: (rows, c) of `type`; bias: (c) f32.
// dx may alias dy. The bias gradient is the column sum of dx (a separate reduction).
cudaError_t bias_gelu_backward(void* dx, const void* dy, const void* x, const float* bias,
                               elem type, std::int64_t rows, std::int64_t c, cudaStream_t stream);

} // namespace dsa::cuda
