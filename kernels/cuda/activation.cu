// Bias + GELU kernels: grid-stride elementwise loops over (rows, c) calling the shared
// per-element math, so only indexing and storage rounding are GPU-specific. Rows a multiple
// of 8 wide with aligned arrays go 8 elements per access and one column index per 8 (the
// per-element 64-bit modulo and 2-byte accesses held the first version to 22% of the copy
// bandwidth on an H200).
#include "kernels/cuda/activation.hpp"

#include "kernels/common/gelu_math.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/vec8.cuh"

namespace dsa::cuda {
namespace {

template <class T>
__global__ void bias_gelu_forward_kernel(T* y, const T* x, const float* bias, long long n,
                                         long long c) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    y[i] = detail::from_float<T>(
        common::bias_gelu_forward_element(detail::to_float(x[i]), bias[i % c]));
}

template <class T>
__global__ void bias_gelu_backward_kernel(T* dx, const T* dy, const T* x, const float* bias,
                                          long long n, long long c) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    dx[i] = detail::from_float<T>(common::bias_gelu_backward_element(
        detail::to_float(dy[i]), detail::to_float(x[i]), bias[i % c]));
}

template <class T>
__global__ void bias_gelu_forward_kernel8(T* y, const T* x, const float* bias, long long n8,
                                          long long c8) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n8;
       i += stride) {
    float v[8], b[8];
    detail::load8(v, x + 8 * i);
    detail::load8(b, bias + 8 * (i % c8));
#pragma unroll
    for (int k = 0; k < 8; ++k)
      v[k] = common::bias_gelu_forward_element(v[k], b[k]);
    detail::store8(y + 8 * i, v);
  }
}

template <class T>
__global__ void bias_gelu_backward_kernel8(T* dx, const T* dy, const T* x, const float* bias,
                                           long long n8, long long c8) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n8;
       i += stride) {
    float g[8], v[8], b[8];
    detail::load8(g, dy + 8 * i);
    detail::load8(v, x + 8 * i);
    detail::load8(b, bias + 8 * (i % c8));
#pragma unroll
    for (int k = 0; k < 8; ++k)
      g[k] = common::bias_gelu_backward_element(g[k], v[k], b[k]);
    detail::store8(dx + 8 * i, g);
  }
}

template <class T> bool vectorizable(long long c, const void* a, const void* b, const void* c_ptr,
                                     const float* bias) {
  return c % 8 == 0 && detail::vec8_aligned<T>(a) && detail::vec8_aligned<T>(b) &&
         detail::vec8_aligned<T>(c_ptr) && detail::vec8_aligned<float>(bias);
}

} // namespace

cudaError_t bias_gelu_forward(void* y, const void* x, const float* bias, elem type,
                              std::int64_t rows, std::int64_t c, cudaStream_t stream) {
  if (rows < 0 || c <= 0 || !y || !x || !bias)
    return cudaErrorInvalidValue;
  const long long n = rows * c;
  if (n == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    if (vectorizable<T>(c, y, x, nullptr, bias))
      bias_gelu_forward_kernel8<T><<<detail::grid_for8(n / 8), detail::block_threads, 0, stream>>>(
          static_cast<T*>(y), static_cast<const T*>(x), bias, n / 8, c / 8);
    else
      bias_gelu_forward_kernel<T><<<detail::grid_for(n), detail::block_threads, 0, stream>>>(
          static_cast<T*>(y), static_cast<const T*>(x), bias, n, c);
    return cudaGetLastError();
  });
}

cudaError_t bias_gelu_backward(void* dx, const void* dy, const void* x, const float* bias,
                               elem type, std::int64_t rows, std::int64_t c, cudaStream_t stream) {
  if (rows < 0 || c <= 0 || !dx || !dy || !x || !bias)
    return cudaErrorInvalidValue;
  const long long n = rows * c;
  if (n == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    if (vectorizable<T>(c, dx, dy, x, bias))
      bias_gelu_backward_kernel8<T><<<detail::grid_for8(n / 8), detail::block_threads, 0, stream>>>(
          static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), bias, n / 8,
          c / 8);
    else
      bias_gelu_backward_kernel<T><<<detail::grid_for(n), detail::block_threads, 0, stream>>>(
          static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), bias, n, c);
    return cudaGetLastError();
  });
}

} // namespace dsa::cuda
