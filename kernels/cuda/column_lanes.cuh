// Column sums in a fixed order by blocks of 32 x 8 threads (bias_backward, the deterministic
// LayerNorm parameter gradients): a block covers 32 x V columns (V consecutive per thread) and
// a chunk of rows; row lane y (threadIdx.y) adds rows y, y + 8, ... of the chunk, and
// sum_row_lanes adds the 8 lanes' sums in lane order. Included by .cu files only.
#pragma once

#include "kernels/cuda/device_math.cuh"

#include <algorithm>
#include <cstdint>

namespace dsa::cuda::detail {

constexpr int lanes_x = 32, lanes_y = 8;

// How a (rows, c) matrix's rows are chunked: at least 64 rows a chunk (8 per row lane), as
// many chunks as fill about 2048 blocks (of 256 columns when c is a multiple of 8, else 32).
// From rows and c alone, so the sums' order, and bits, do not depend on the device.
struct row_chunks {
  std::int64_t count = 1, rows_each = 0;
};
inline row_chunks chunk_rows(std::int64_t rows, std::int64_t c) {
  const std::int64_t per_block = c % 8 == 0 ? 8 * lanes_x : lanes_x;
  const std::int64_t column_blocks = (c + per_block - 1) / per_block;
  row_chunks out;
  out.count = std::max<std::int64_t>(1, std::min((rows + 63) / 64, std::max<std::int64_t>(1, 2048 / column_blocks)));
  out.rows_each = (rows + out.count - 1) / out.count;
  out.count = (rows + out.rows_each - 1) / out.rows_each;
  return out;
}

// Every thread's V sums (its columns start + threadIdx.x V ..) into `lanes`, then for each
// of the block's lanes_x V columns j below c: out(j, the 8 row lanes' sums added in lane
// order). Every thread of the block must call it (it synchronises the block before reading);
// it does not synchronise after, so two calls in a row need two shared arrays.
template <int V, class Out>
__device__ __forceinline__ void sum_row_lanes(float (&lanes)[lanes_y][lanes_x * V], const float (&mine)[V],
                                              long long start, long long c, Out&& out) {
#pragma unroll
  for (int k = 0; k < V; ++k)
    lanes[threadIdx.y][threadIdx.x * V + k] = mine[k];
  __syncthreads();
  for (int i = threadIdx.y * lanes_x + threadIdx.x; i < lanes_x * V; i += lanes_x * lanes_y) {
    const long long j = start + i;
    if (j >= c)
      continue;
    float total = 0.0f;
#pragma unroll
    for (int y = 0; y < lanes_y; ++y)
      total += lanes[y][i];
    out(j, total);
  }
}

} // namespace dsa::cuda::detail
