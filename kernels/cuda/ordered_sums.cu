// Deterministic column sums and keyed row sums; see ordered_sums.hpp.
#include "kernels/cuda/ordered_sums.hpp"

#include "kernels/cuda/column_lanes.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/vec8.cuh"

#include <algorithm>

namespace dsa::cuda {
namespace {

// Blocks of 32 x 8 threads, as bias_backward's: block (x, y) covers 32 V columns (V
// consecutive per thread, 16-byte loads when V is 8) of chunk y of the rows; row lane t adds
// rows t, t + 8, ... of the chunk, the lanes' sums then added in lane order. The chunk's
// dy xhat and dy sums go to partial[y][2c] (gamma's c, then beta's c).
using detail::lanes_x;
using detail::lanes_y;

template <class T, int V>
__global__ void __launch_bounds__(lanes_x * lanes_y)
    layernorm_param_partial_kernel(float* partial, const T* dy, const T* x, const float* mean, const float* rstd,
                                   long long rows, long long c, long long rows_per_chunk) {
  __shared__ float g_lanes[lanes_y][lanes_x * V], b_lanes[lanes_y][lanes_x * V];
  const long long start = static_cast<long long>(blockIdx.x) * lanes_x * V;
  const long long col = start + static_cast<long long>(threadIdx.x) * V;
  const long long first = static_cast<long long>(blockIdx.y) * rows_per_chunk;
  const long long last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  float g[V], b[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    g[k] = 0.0f;
    b[k] = 0.0f;
  }
  if (col < c) {
#pragma unroll 4
    for (long long r = first + threadIdx.y; r < last; r += lanes_y) {
      const float m = mean[r], s = rstd[r];
      if constexpr (V == 8) {
        float d[8], v[8];
        detail::load8(d, dy + r * c + col);
        detail::load8(v, x + r * c + col);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float xhat = (v[k] - m) * s;
          g[k] += d[k] * xhat;
          b[k] += d[k];
        }
      } else {
        const float d = detail::to_float(dy[r * c + col]);
        const float xhat = (detail::to_float(x[r * c + col]) - m) * s;
        g[0] += d * xhat;
        b[0] += d;
      }
    }
  }
  float* out = partial + static_cast<long long>(blockIdx.y) * 2 * c;
  detail::sum_row_lanes<V>(g_lanes, g, start, c, [&](long long j, float total) { out[j] = total; });
  detail::sum_row_lanes<V>(b_lanes, b, start, c, [&](long long j, float total) { out[c + j] = total; });
}

// The chunks' sums per column of partial's 2c, the same lanes (lane y adds chunks y, y + 8,
// ..., the lanes in order: a fixed order): column j < c
// onto dgamma[j], the rest onto dbeta[j - c] (either may be null).
__global__ void __launch_bounds__(lanes_x * lanes_y)
    layernorm_param_finish_kernel(float* dgamma, float* dbeta, const float* partial, long long chunks, long long c) {
  __shared__ float lanes[lanes_y][lanes_x];
  const long long start = static_cast<long long>(blockIdx.x) * lanes_x;
  const long long j = start + threadIdx.x;
  float sum[1] = {0.0f};
  if (j < 2 * c)
    for (long long k = threadIdx.y; k < chunks; k += lanes_y)
      sum[0] += partial[k * 2 * c + j];
  detail::sum_row_lanes<1>(lanes, sum, start, 2 * c, [&](long long col, float total) {
    if (col < c) {
      if (dgamma)
        dgamma[col] += total;
    } else if (dbeta) {
      dbeta[col - c] += total;
    }
  });
}

// Block (k, y): key k, columns y blockDim.x .. (y + 1) blockDim.x - 1, a thread per column.
template <class T>
__global__ void ordered_row_scatter_kernel(float* table, const T* src, const std::int32_t* key,
                                           const std::int32_t* offsets, const std::int32_t* order, long long c) {
  const long long k = blockIdx.x;
  const long long j = blockIdx.y * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (j >= c)
    return;
  const long long first = offsets[k], last = offsets[k + 1];
  float sum = 0.0f;
  for (long long i = first; i < last; ++i)
    sum += detail::to_float(src[static_cast<long long>(order[i]) * c + j]);
  table[static_cast<long long>(key[k]) * c + j] += sum;
}

} // namespace

cudaError_t layernorm_param_backward(float* dgamma, float* dbeta, const void* dy, const void* x, const float* mean,
                                     const float* rstd, elem type, std::int64_t rows, std::int64_t c,
                                     cudaStream_t stream) {
  if (rows < 0 || c <= 0 || (!dgamma && !dbeta) || !dy || !x || !mean || !rstd || rows > (std::int64_t{1} << 62) / c ||
      (c + 15) / 16 > 2147483647LL) // the finish grid's ceil(2c / 32) blocks, without forming 2c
    return cudaErrorInvalidValue;
  if (rows == 0)
    return cudaSuccess;
  // Chunked as bias_backward's rows (detail::chunk_rows).
  const detail::row_chunks split = detail::chunk_rows(rows, c);
  const std::int64_t chunks = split.count, per_chunk = split.rows_each;
  float* partial = nullptr;
  cudaError_t e =
      cudaMallocAsync(reinterpret_cast<void**>(&partial), static_cast<std::size_t>(chunks * 2 * c) * sizeof(float),
                      stream);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); // not left behind for the next launcher to report
    return e;
  }
  e = detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    const T* d = static_cast<const T*>(dy);
    const T* v = static_cast<const T*>(x);
    const dim3 block(lanes_x, lanes_y);
    if (c % 8 == 0 && detail::vec8_aligned<T>(d) && detail::vec8_aligned<T>(v)) {
      const dim3 grid(static_cast<unsigned>((c + 8 * lanes_x - 1) / (8 * lanes_x)), static_cast<unsigned>(chunks));
      layernorm_param_partial_kernel<T, 8><<<grid, block, 0, stream>>>(partial, d, v, mean, rstd, rows, c, per_chunk);
    } else {
      const dim3 grid(static_cast<unsigned>((c + lanes_x - 1) / lanes_x), static_cast<unsigned>(chunks));
      layernorm_param_partial_kernel<T, 1><<<grid, block, 0, stream>>>(partial, d, v, mean, rstd, rows, c, per_chunk);
    }
    return cudaGetLastError();
  });
  if (e == cudaSuccess) {
    const dim3 grid(static_cast<unsigned>((2 * c + lanes_x - 1) / lanes_x));
    layernorm_param_finish_kernel<<<grid, dim3(lanes_x, lanes_y), 0, stream>>>(dgamma, dbeta, partial, chunks, c);
    e = cudaGetLastError();
  }
  const cudaError_t freed = cudaFreeAsync(partial, stream);
  return e != cudaSuccess ? e : freed;
}

cudaError_t ordered_row_scatter_add(float* table, const void* src, const std::int32_t* key,
                                    const std::int32_t* offsets, const std::int32_t* order, elem type,
                                    std::int64_t keys, std::int64_t c, cudaStream_t stream) {
  if (keys < 0 || keys > 2147483647LL || c <= 0 || !table || !src || !key || !offsets || !order)
    return cudaErrorInvalidValue;
  if (keys == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    const dim3 grid(static_cast<unsigned>(keys),
                    static_cast<unsigned>((c + detail::block_threads - 1) / detail::block_threads));
    ordered_row_scatter_kernel<T><<<grid, detail::block_threads, 0, stream>>>(table, static_cast<const T*>(src), key,
                                                                             offsets, order, c);
    return cudaGetLastError();
  });
}

} // namespace dsa::cuda
