// Bias add: a grid-stride loop over the elements. Bias-gradient column sums: blocks of 32 x 8
// threads, consecutive threads reading consecutive columns of a row (so loads coalesce),
// each row lane adding every eighth row of its chunk, the lanes and then the chunks added in
// a fixed order (deterministic, no atomics).
#include "kernels/cuda/bias.hpp"

#include "kernels/cuda/column_lanes.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/vec8.cuh"

#include <algorithm>
#include <limits>

namespace dsa::cuda {
namespace {

template <class T>
__global__ void bias_add_kernel(T* y, const float* x, const float* bias, long long n, long long c) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    y[i] = detail::from_float<T>(x[i] + bias[i % c]);
}

template <class T>
__global__ void bias_add_kernel8(T* y, const float* x, const float* bias, long long n8, long long c8) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n8;
       i += stride) {
    float v[8], b[8];
    detail::load8(v, x + 8 * i);
    detail::load8(b, bias + 8 * (i % c8));
#pragma unroll
    for (int k = 0; k < 8; ++k)
      v[k] += b[k];
    detail::store8(y + 8 * i, v);
  }
}

// Column sums of a (rows, c) matrix in a fixed order: a block of 32 x 8 threads covers
// 32 x V columns (V consecutive columns per thread: 16-byte loads when V is 8) and the
// rows of its chunk (blockIdx.y); row lane y adds rows y, y + 8, ... of the chunk, then
// the lanes' sums are added in lane order. out: row blockIdx.y of a (chunks, c) matrix, or
// with `accumulate` (one chunk) the c sums added onto out.
using detail::lanes_x;
using detail::lanes_y;

template <class T, int V>
__global__ void __launch_bounds__(lanes_x * lanes_y)
    column_sums_kernel(float* out, const T* in, long long rows, long long c, long long rows_per_chunk,
                       bool accumulate) {
  __shared__ float lane_sums[lanes_y][lanes_x * V];
  const long long start = static_cast<long long>(blockIdx.x) * lanes_x * V;
  const long long col = start + static_cast<long long>(threadIdx.x) * V;
  const long long first = static_cast<long long>(blockIdx.y) * rows_per_chunk;
  const long long last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  float sum[V];
#pragma unroll
  for (int k = 0; k < V; ++k)
    sum[k] = 0.0f;
  if (col < c) {
#pragma unroll 8
    for (long long r = first + threadIdx.y; r < last; r += lanes_y) {
      if constexpr (V == 8) {
        float v[8];
        detail::load8(v, in + r * c + col);
#pragma unroll
        for (int k = 0; k < 8; ++k)
          sum[k] += v[k];
      } else {
        sum[0] += detail::to_float(in[r * c + col]);
      }
    }
  }
  detail::sum_row_lanes<V>(lane_sums, sum, start, c, [&](long long j, float total) {
    float* o = accumulate ? out + j : out + static_cast<long long>(blockIdx.y) * c + j;
    *o = accumulate ? *o + total : total;
  });
}

// One launch of column_sums_kernel over `chunks` chunks of `per_chunk` rows.
template <class T>
cudaError_t launch_column_sums(float* out, const T* in, long long rows, long long c, long long chunks,
                               long long per_chunk, bool accumulate, cudaStream_t stream) {
  const bool wide = c % 8 == 0 && detail::vec8_aligned<T>(in);
  const long long per_block = lanes_x * (wide ? 8 : 1);
  const dim3 grid(static_cast<unsigned>((c + per_block - 1) / per_block), static_cast<unsigned>(chunks));
  const dim3 block(lanes_x, lanes_y);
  if (wide)
    column_sums_kernel<T, 8><<<grid, block, 0, stream>>>(out, in, rows, c, per_chunk, accumulate);
  else
    column_sums_kernel<T, 1><<<grid, block, 0, stream>>>(out, in, rows, c, per_chunk, accumulate);
  return cudaGetLastError();
}

} // namespace

cudaError_t bias_add(void* y, const float* x, const float* bias, elem type, std::int64_t rows,
                     std::int64_t c, cudaStream_t stream) {
  if (rows < 0 || c <= 0 || !y || !x || !bias || rows > (std::int64_t{1} << 62) / c ||
      (type != elem::f32 && static_cast<const void*>(x) == y))
    return cudaErrorInvalidValue;
  if (rows == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    if (c % 8 == 0 && detail::vec8_aligned<T>(y) && detail::vec8_aligned<float>(x) &&
        detail::vec8_aligned<float>(bias))
      bias_add_kernel8<T><<<detail::grid_for8(rows * c / 8), detail::block_threads, 0, stream>>>(
          static_cast<T*>(y), x, bias, rows * c / 8, c / 8);
    else
      bias_add_kernel<T><<<detail::grid_for(rows * c), detail::block_threads, 0, stream>>>(
          static_cast<T*>(y), x, bias, rows * c, c);
    return cudaGetLastError();
  });
}

cudaError_t bias_backward(float* dbias, const void* dy, elem type, std::int64_t rows,
                          std::int64_t c, cudaStream_t stream) {
  if (rows < 0 || c <= 0 || !dbias || !dy || rows > (std::int64_t{1} << 62) / c ||
      (c + lanes_x - 1) / lanes_x > std::numeric_limits<int>::max())
    return cudaErrorInvalidValue;
  if (rows == 0)
    return cudaSuccess;
  // One chunk sums straight onto dbias; more write their sums to a stream-ordered scratch
  // that a second pass of the same kernel adds (its row lanes over the chunks: a fixed order).
  const detail::row_chunks split = detail::chunk_rows(rows, c);
  const std::int64_t chunks = split.count, per_chunk = split.rows_each;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    const T* in = static_cast<const T*>(dy);
    if (chunks == 1)
      return launch_column_sums<T>(dbias, in, rows, c, 1, rows, true, stream);
    float* partial = nullptr;
    cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&partial),
                                    static_cast<std::size_t>(chunks * c) * sizeof(float), stream);
    if (e != cudaSuccess) {
      (void)cudaGetLastError(); // not left behind for the next launcher to report
      return e;
    }
    e = launch_column_sums<T>(partial, in, rows, c, chunks, per_chunk, false, stream);
    if (e == cudaSuccess)
      e = launch_column_sums<float>(dbias, partial, chunks, c, 1, chunks, true, stream);
    const cudaError_t freed = cudaFreeAsync(partial, stream);
    return e != cudaSuccess ? e : freed;
  });
}

} // namespace dsa::cuda
