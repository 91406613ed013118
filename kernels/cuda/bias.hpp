// Bias add and bias gradient on the GPU (the twins of kernels/cpu/bias.hpp's bias_add and
// bias_backward).
#pragma once

#include "kernels/cuda/elem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::cuda {

// y = x + bias over each row (overwrite), the f32 sum rounded once to y_type: the CPU's
// bias add on an f32 product, then its cast. y: (rows, c) of y_type; x: (rows, c) f32;
// bias: (c) f32. y may alias x when y_type is f32. For the projections whose product is
// half: cuBLASLt's bias epilogue takes no f32 bias for half outputs, and a half bias (or a
// half product) would round once more than the CPU does.
cudaError_t bias_add(void* y, const float* x, const float* bias, elem y_type, std::int64_t rows,
                     std::int64_t c, cudaStream_t stream);

// dbias: (c) f32 += column sums of dy: (rows, c) of `type` (the bias gradient of a
// linear layer or of bias+GELU). No atomics, a fixed order: blocks of 32 x 8 threads over
// 256 columns (8 per thread) or 32, each of the 8 row lanes adding every eighth row of a
// chunk, the lanes' sums added in lane order; with more than 64 rows, chunks of rows summed
// in parallel first (a stream-ordered scratch of chunks x c floats, at most 2048 x 256, 2 MiB),
// then each column's chunk sums added by the same kernel (its lanes over the chunks, in a
// fixed order). The chunks follow
// from rows and c alone, so the bits do not depend on the device.
cudaError_t bias_backward(float* dbias, const void* dy, elem type, std::int64_t rows,
                          std::int64_t c, cudaStream_t stream);

} // namespace dsa::cuda
