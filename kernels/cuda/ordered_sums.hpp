// Sums in a fixed order, for the deterministic mode (devices.deterministic): the LayerNorm
// parameter gradients and the embedding tables' row gradients without float atomics, so a
// GPU run adds the same terms in the same order every time. The default path's fused
// kernels add these through atomics (fast, order varies); this mode computes them apart.
#pragma once

#include "kernels/cuda/elem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::cuda {

// dgamma[j] += sum_r dy[r][j] xhat[r][j] and dbeta[j] += sum_r dy[r][j], with
// xhat = (x - mean[r]) rstd[r] in f32 (the fused backward kernels' terms). dy, x: (rows, c)
// of `type`; mean, rstd: (rows) f32; dgamma, dbeta: (c) f32, either may be null (not
// wanted), not both. Blocks of 32 x 8 threads (8 columns per thread where aligned), each of
// the 8 row lanes adding every eighth row of a chunk, the lanes' sums in lane order; then
// each column's chunk sums by the same lanes, in a fixed order (a stream-ordered scratch of 2 c floats per
// chunk, chunks following from rows and c alone): the same bits every run, on any device.
cudaError_t layernorm_param_backward(float* dgamma, float* dbeta, const void* dy, const void* x, const float* mean,
                                     const float* rstd, elem type, std::int64_t rows, std::int64_t c,
                                     cudaStream_t stream);

// Rows gathered by key, in a given order: for each k < keys,
//   table[key[k]][j] += sum over i in [offsets[k], offsets[k + 1]) of src[order[i]][j]
// (in that order, in f32). table: (>= max key + 1, c) f32; src: (rows, c) of `type`;
// key: (keys) int32, all distinct (the caller's invariant: no atomics); offsets: (keys + 1)
// int32, non-decreasing from 0; order: (offsets[keys]) int32 row indices. All on the
// device. A block per key and 256 columns, a thread per column (a key with many rows, a
// token type's, is summed serially by each of its threads: correct, not fast).
cudaError_t ordered_row_scatter_add(float* table, const void* src, const std::int32_t* key,
                                    const std::int32_t* offsets, const std::int32_t* order, elem type,
                                    std::int64_t keys, std::int64_t c, cudaStream_t stream);

} // namespace dsa::cuda
