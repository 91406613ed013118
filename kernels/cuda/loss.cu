// Pre-training head kernels. Cross-entropy: a block of detail::block_threads per row, each
// thread striding over the row, which is read three times (maximum; sum of exponentials
// and first index of the maximum; gradient) rather than kept in shared memory, as
// softmax.cu does. tanh: grid-stride elementwise loops. Row gather and scatter: a block
// per row.
#include "kernels/cuda/loss.hpp"

#include "kernels/cuda/device_math.cuh"

#include <math_constants.h>

namespace dsa::cuda {
namespace {

// Minimum over a block of detail::block_threads threads; every thread gets the result.
__device__ __forceinline__ int block_min(int x, int* scratch) {
  for (int o = 16; o > 0; o >>= 1)
    x = min(x, __shfl_xor_sync(detail::full_mask, x, o));
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  __syncthreads();
  if (lane == 0)
    scratch[warp] = x;
  __syncthreads();
  int m = scratch[0];
  for (int w = 1; w < detail::warps_per_block; ++w)
    m = min(m, scratch[w]);
  return m;
}

// Every branch below depends on the row's label or on block-wide results only, so the
// whole block takes it and the reductions' __syncthreads are reached by every thread.
template <class T>
__global__ void cross_entropy_kernel(T* dlogits, float* row_loss, std::int32_t* row_correct,
                                     const T* logits, const std::int32_t* labels,
                                     std::int32_t ignore_index, float scale, long long classes) {
  __shared__ float float_scratch[detail::warps_per_block];
  __shared__ int int_scratch[detail::warps_per_block];
  const long long row = blockIdx.x;
  const T* x = logits + row * classes;
  T* d = dlogits ? dlogits + row * classes : nullptr;
  const std::int32_t label = labels[row];
  const bool ignored = label == ignore_index;
  if (ignored || label < 0 || label >= classes) {
    // An out-of-range label is the caller's bug: NaN marks the row instead of a read past it.
    const float fill = ignored ? 0.0f : CUDART_NAN_F;
    if (d)
      for (long long j = threadIdx.x; j < classes; j += blockDim.x)
        d[j] = detail::from_float<T>(fill);
    if (threadIdx.x == 0) {
      if (row_loss)
        row_loss[row] = fill;
      if (row_correct)
        row_correct[row] = 0;
    }
    return;
  }
  // Read before the reductions' barriers, so before any thread writes d over x in place.
  const float at_label = detail::to_float(x[label]);

  float mx = -CUDART_INF_F;
  for (long long j = threadIdx.x; j < classes; j += blockDim.x)
    mx = fmaxf(mx, detail::to_float(x[j]));
  mx = detail::block_max(mx, float_scratch);

  // Each thread visits its indices in increasing order, so its first hit is its smallest.
  const int none = static_cast<int>(classes);
  float sum = 0.0f;
  int first = none;
  for (long long j = threadIdx.x; j < classes; j += blockDim.x) {
    const float v = detail::to_float(x[j]);
    sum += expf(v - mx);
    if (first == none && v == mx)
      first = static_cast<int>(j);
  }
  sum = detail::block_sum(sum, float_scratch);
  first = block_min(first, int_scratch);
  const int argmax = first < none ? first : none - 1; // all NaN: the CPU's scan ends at the last

  if (threadIdx.x == 0) {
    if (row_loss)
      row_loss[row] = logf(sum) + (mx - at_label);
    if (row_correct)
      row_correct[row] = argmax == label ? 1 : 0;
  }
  if (!d)
    return;
  const float inv = scale / sum;
  // Each thread reads x[j] and then writes d[j] for its own j only: in place is safe.
  for (long long j = threadIdx.x; j < classes; j += blockDim.x) {
    float g = expf(detail::to_float(x[j]) - mx) * inv;
    if (j == label)
      g -= scale;
    d[j] = detail::from_float<T>(g);
  }
}

template <class T> __global__ void tanh_forward_kernel(T* y, const T* x, long long n) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    y[i] = detail::from_float<T>(tanhf(detail::to_float(x[i])));
}

template <class T>
__global__ void tanh_backward_kernel(T* dx, const T* dy, const T* y, long long n) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const float v = detail::to_float(y[i]);
    dx[i] = detail::from_float<T>(detail::to_float(dy[i]) * fmaf(-v, v, 1.0f));
  }
}

template <class T>
__global__ void gather_rows_kernel(T* dst, const T* src, const std::int64_t* rows_index,
                                   long long c) {
  const long long i = blockIdx.x;
  const T* s = src + rows_index[i] * c;
  T* d = dst + i * c;
  for (long long j = threadIdx.x; j < c; j += blockDim.x)
    d[j] = s[j];
}

template <class T>
__global__ void scatter_add_rows_kernel(T* dst, const T* src, const std::int64_t* rows_index,
                                        long long c) {
  const long long i = blockIdx.x;
  const T* s = src + i * c;
  T* d = dst + rows_index[i] * c;
  for (long long j = threadIdx.x; j < c; j += blockDim.x)
    d[j] = detail::from_float<T>(detail::to_float(d[j]) + detail::to_float(s[j]));
}

constexpr std::int64_t max_blocks = 2147483647; // gridDim.x

// rows * c elements, each of rows and c in [0, 2^31), so the product fits in 64 bits.
bool bad_rows(std::int64_t rows, std::int64_t c) {
  return rows < 0 || rows > max_blocks || c <= 0 || c > max_blocks;
}

} // namespace

cudaError_t cross_entropy(void* dlogits, float* row_loss, std::int32_t* row_correct,
                          const void* logits, const std::int32_t* labels, std::int32_t ignore_index,
                          float scale, elem type, std::int64_t rows, std::int64_t classes,
                          cudaStream_t stream) {
  if (bad_rows(rows, classes) || !logits || !labels || (!dlogits && !row_loss && !row_correct))
    return cudaErrorInvalidValue;
  if (rows == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_kernel<T><<<static_cast<unsigned>(rows), detail::block_threads, 0, stream>>>(
        static_cast<T*>(dlogits), row_loss, row_correct, static_cast<const T*>(logits), labels,
        ignore_index, scale, classes);
    return cudaGetLastError();
  });
}

cudaError_t tanh_forward(void* y, const void* x, elem type, std::int64_t n, cudaStream_t stream) {
  if (n < 0 || !y || !x)
    return cudaErrorInvalidValue;
  if (n == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    tanh_forward_kernel<T><<<detail::grid_for(n), detail::block_threads, 0, stream>>>(
        static_cast<T*>(y), static_cast<const T*>(x), n);
    return cudaGetLastError();
  });
}

cudaError_t tanh_backward(void* dx, const void* dy, const void* y, elem type, std::int64_t n,
                          cudaStream_t stream) {
  if (n < 0 || !dx || !dy || !y)
    return cudaErrorInvalidValue;
  if (n == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    tanh_backward_kernel<T><<<detail::grid_for(n), detail::block_threads, 0, stream>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(y), n);
    return cudaGetLastError();
  });
}

cudaError_t gather_rows(void* dst, const void* src, const std::int64_t* rows_index, elem type,
                        std::int64_t count, std::int64_t c, cudaStream_t stream) {
  if (bad_rows(count, c) || !dst || !src || !rows_index)
    return cudaErrorInvalidValue;
  if (count == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    gather_rows_kernel<T><<<static_cast<unsigned>(count), detail::block_threads, 0, stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), rows_index, c);
    return cudaGetLastError();
  });
}

cudaError_t scatter_add_rows(void* dst, const void* src, const std::int64_t* rows_index, elem type,
                             std::int64_t count, std::int64_t c, cudaStream_t stream) {
  if (bad_rows(count, c) || !dst || !src || !rows_index)
    return cudaErrorInvalidValue;
  if (count == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    scatter_add_rows_kernel<T><<<static_cast<unsigned>(count), detail::block_threads, 0, stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), rows_index, c);
    return cudaGetLastError();
  });
}

} // namespace dsa::cuda
