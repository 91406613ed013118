// Bias gradient on the GPU (the twin of kernels/cpu/bias.hpp's bias_backward).
#pragma once

#include "kernels/cuda/elem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::cuda {

// dbias: (c) f32 += column sums of dy: (rows, c) of `type` (the bias gradient of a
// linear layer or of bias+GELU). Each thread owns a column: no atomics, a fixed order.
cudaError_t bias_backward(float* dbias, const void* dy, elem type, std::int64_t rows,
                          std::int64_t c, cudaStream_t stream);

} // namespace dsa::cuda
