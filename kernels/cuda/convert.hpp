// Storage conversions on the GPU: f32 <-> f16/bf16 (round to nearest even), as the CPU's
// conversions (core/half.hpp).
#pragma once

#include "kernels/cuda/elem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::cuda {

// dst (n) of dst_type = src (n) of src_type; the same type is a copy. dst and src must not
// overlap unless they are the same array of the same type.
cudaError_t convert(void* dst, elem dst_type, const void* src, elem src_type, std::int64_t n,
                    cudaStream_t stream);

} // namespace dsa::cuda
