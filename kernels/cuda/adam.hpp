// Fused Adam / AdamW on the GPU with an optional f16/bf16 copy-out of the updated
// parameters, using the element rule of kernels/common/adam_math.hpp. The constants
// come from cpu::make_adam_consts, so CPU and GPU run the same f32 arithmetic.
#pragma once

#include "kernels/common/adam_math.hpp"
#include "kernels/cuda/elem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::cuda {

// param, m, v: (n) f32 updated in place; grad: (n) f32.
// half_out: (n) raw f16/bf16 words (half_type f16 or bf16) written in the same pass, or null.
cudaError_t adam_update(float* param, float* m, float* v, const float* grad,
                        std::uint16_t* half_out, elem half_type, const common::adam_consts& consts,
                        std::int64_t n, cudaStream_t stream);

} // namespace dsa::cuda
