// Attention's two layouts on the GPU: the projections' rows (batch * seq, heads * d), head h
// being column block h of width d, and head-major (batch, heads, seq, d), where every (b, h)
// matrix starts at a multiple of seq * d so that one strided-batched product covers all of
// them. The copies between the two are exact (a bias, if any, added in f32 and rounded once).
#pragma once

#include "kernels/cuda/elem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::cuda {

// heads[b][h][t][j] = src[b * seq + t][h * d + j] (+ bias[h * d + j]), written as dst_type.
// src: (batch * seq, heads * d) of src_type; bias: (heads * d) f32 or null. dst and src must
// not overlap. src_type f32 with a half dst_type is the projections' f32 product and bias
// rounded once, as the CPU's bias add and cast.
cudaError_t split_heads(void* dst, elem dst_type, const void* src, elem src_type,
                        const float* bias, std::int64_t batch, std::int64_t seq,
                        std::int64_t heads, std::int64_t d, cudaStream_t stream);

// rows[b * seq + t][h * d + j] = heads[b][h][t][j], both of `type`; they must not overlap.
cudaError_t merge_heads(void* dst, const void* src, elem type, std::int64_t batch,
                        std::int64_t seq, std::int64_t heads, std::int64_t d,
                        cudaStream_t stream);

} // namespace dsa::cuda
