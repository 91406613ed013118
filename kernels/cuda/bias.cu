// Bias add: a grid-stride loop over the elements. Bias-gradient column sums: one thread per column (consecutive threads read
// consecutive columns of a row, so loads coalesce), rows added in order.
#include "kernels/cuda/bias.hpp"

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/vec8.cuh"

#include <algorithm>

namespace dsa::cuda {
namespace {

template <class T>
__global__ void bias_add_kernel(T* y, const float* x, const float* bias, long long n, long long c) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    y[i] = detail::from_float<T>(x[i] + bias[i % c]);
}

// Tall inputs in two passes: column sums over chunks of rows (a grid of column blocks by
// chunks), then each column's chunk sums in chunk order. Deterministic, like the one pass.
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

template <class T>
__global__ void bias_partial_kernel(float* partial, const T* dy, long long rows, long long c,
                                    long long rows_per_chunk) {
  const long long j = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (j >= c)
    return;
  const long long first = blockIdx.y * rows_per_chunk;
  const long long last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  float sum = 0.0f;
  for (long long r = first; r < last; ++r)
    sum += detail::to_float(dy[r * c + j]);
  partial[blockIdx.y * c + j] = sum;
}

// The same with 8 columns per thread (c a multiple of 8, dy aligned): 16-byte loads.
template <class T>
__global__ void bias_partial_kernel8(float* partial, const T* dy, long long rows, long long c,
                                     long long rows_per_chunk) {
  const long long j8 = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (8 * j8 >= c)
    return;
  const long long first = blockIdx.y * rows_per_chunk;
  const long long last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  float sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (long long r = first; r < last; ++r) {
    float v[8];
    detail::load8(v, dy + r * c + 8 * j8);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      sum[k] += v[k];
  }
  detail::store8(partial + blockIdx.y * c + 8 * j8, sum);
}

__global__ void bias_finish_kernel(float* dbias, const float* partial, long long chunks,
                                   long long c) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long j = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; j < c;
       j += stride) {
    float sum = 0.0f;
    for (long long k = 0; k < chunks; ++k)
      sum += partial[k * c + j];
    dbias[j] += sum;
  }
}

template <class T>
__global__ void bias_backward_kernel(float* dbias, const T* dy, long long rows, long long c) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long j = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; j < c;
       j += stride) {
    float sum = 0.0f;
    for (long long r = 0; r < rows; ++r)
      sum += detail::to_float(dy[r * c + j]);
    dbias[j] += sum;
  }
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
  if (rows < 0 || c <= 0 || !dbias || !dy)
    return cudaErrorInvalidValue;
  if (rows == 0)
    return cudaSuccess;
  // One thread per column is enough parallelism only for short inputs: taller ones (a
  // BERT-large micro-batch is 8192 rows of 1024) sum chunks of rows in parallel first.
  constexpr std::int64_t one_pass_rows = 256;
  if (rows > one_pass_rows) {
    const std::int64_t per_chunk = std::max<std::int64_t>(64, (rows + 1023) / 1024);
    const std::int64_t chunks = (rows + per_chunk - 1) / per_chunk;
    float* partial = nullptr;
    cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&partial),
                                    static_cast<std::size_t>(chunks * c) * sizeof(float), stream);
    if (e != cudaSuccess) {
      (void)cudaGetLastError(); // not left behind for the next launcher to report
      return e;
    }
    e = detail::dispatch(type, [&](auto tag) {
      using T = decltype(tag);
      if (c % 8 == 0 && detail::vec8_aligned<T>(dy)) {
        const dim3 grid(
            static_cast<unsigned>((c / 8 + detail::block_threads - 1) / detail::block_threads),
            static_cast<unsigned>(chunks));
        bias_partial_kernel8<T><<<grid, detail::block_threads, 0, stream>>>(
            partial, static_cast<const T*>(dy), rows, c, per_chunk);
      } else {
        const dim3 grid(
            static_cast<unsigned>((c + detail::block_threads - 1) / detail::block_threads),
            static_cast<unsigned>(chunks));
        bias_partial_kernel<T><<<grid, detail::block_threads, 0, stream>>>(
            partial, static_cast<const T*>(dy), rows, c, per_chunk);
      }
      return cudaGetLastError();
    });
    if (e == cudaSuccess) {
      bias_finish_kernel<<<detail::grid_for(c), detail::block_threads, 0, stream>>>(dbias, partial,
                                                                                    chunks, c);
      e = cudaGetLastError();
    }
    const cudaError_t freed = cudaFreeAsync(partial, stream);
    return e != cudaSuccess ? e : freed;
  }
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    bias_backward_kernel<T><<<detail::grid_for(c), detail::block_threads, 0, stream>>>(
        dbias, static_cast<const T*>(dy), rows, c);
    return cudaGetLastError();
  });
}

} // namespace dsa::cuda
