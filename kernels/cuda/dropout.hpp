// Dropout on the GPU with masks from the same Philox counters as the CPU
// (kernels/common/dropout_math.hpp): a CUDA run with dropout on compares with a CPU run.
#pragma once

#include "core/philox.hpp"
#include "kernels/cuda/elem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::cuda {

// y = x * mask / (1 - p) (overwrite); mask: (n) u8, 1 = kept, written when non-null.
// y, x: (n) of `type`; y may alias x. p in [0, 1); n < 2^34 (the stream's Philox blocks).
cudaError_t dropout_forward(void* y, std::uint8_t* mask, const void* x, float p,
                            const philox_stream& rng, elem type, std::int64_t n,
                            cudaStream_t stream);

// dx = dy * mask / (1 - p) (overwrite), the mask recomputed from `rng` (no mask buffer:
// what the memory flags of a recomputing backward want). dx, dy: (n) of `type`; dx may
// alias dy. Equals cpu::dropout_backward with cpu::dropout_mask's mask.
cudaError_t dropout_backward(void* dx, const void* dy, float p, const philox_stream& rng, elem type,
                             std::int64_t n, cudaStream_t stream);

} // namespace dsa::cuda
