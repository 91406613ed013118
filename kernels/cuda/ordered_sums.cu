// Deterministic column sums and keyed row sums; see ordered_sums.hpp.
#include "kernels/cuda/ordered_sums.hpp"

#include "kernels/cuda/device_math.cuh"

#include <algorithm>

namespace dsa::cuda {
namespace {

// Chunk y of the rows, thread per column: its dy xhat and dy sums into partial[y][2c].
template <class T>
__global__ void layernorm_param_partial_kernel(float* partial, const T* dy, const T* x, const float* mean,
                                               const float* rstd, long long rows, long long c,
                                               long long rows_per_chunk) {
  const long long j = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (j >= c)
    return;
  const long long first = blockIdx.y * rows_per_chunk;
  const long long last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  float g = 0.0f, b = 0.0f;
  for (long long r = first; r < last; ++r) {
    const float d = detail::to_float(dy[r * c + j]);
    const float xhat = (detail::to_float(x[r * c + j]) - mean[r]) * rstd[r];
    g += d * xhat;
    b += d;
  }
  partial[blockIdx.y * 2 * c + j] = g;
  partial[blockIdx.y * 2 * c + c + j] = b;
}

__global__ void layernorm_param_finish_kernel(float* dgamma, float* dbeta, const float* partial, long long chunks,
                                              long long c) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long j = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; j < c; j += stride) {
    float g = 0.0f, b = 0.0f;
    for (long long k = 0; k < chunks; ++k) {
      g += partial[k * 2 * c + j];
      b += partial[k * 2 * c + c + j];
    }
    if (dgamma)
      dgamma[j] += g;
    if (dbeta)
      dbeta[j] += b;
  }
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
  if (rows < 0 || c <= 0 || (!dgamma && !dbeta) || !dy || !x || !mean || !rstd || rows > (std::int64_t{1} << 62) / c)
    return cudaErrorInvalidValue;
  if (rows == 0)
    return cudaSuccess;
  // A thread per column over chunks of at least 64 rows, at most 1024 chunks (the layout
  // bias_backward had before its 2-D blocks).
  const std::int64_t per_chunk = std::max<std::int64_t>(64, (rows + 1023) / 1024);
  const std::int64_t chunks = (rows + per_chunk - 1) / per_chunk;
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
    const dim3 grid(static_cast<unsigned>((c + detail::block_threads - 1) / detail::block_threads),
                    static_cast<unsigned>(chunks));
    layernorm_param_partial_kernel<T><<<grid, detail::block_threads, 0, stream>>>(
        partial, static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd, rows, c, per_chunk);
    return cudaGetLastError();
  });
  if (e == cudaSuccess) {
    layernorm_param_finish_kernel<<<detail::grid_for(c), detail::block_threads, 0, stream>>>(dgamma, dbeta, partial,
                                                                                            chunks, c);
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
