// Bias + GELU kernels: grid-stride elementwise loops over (rows, c) calling the shared
// per-element math, so only indexing and storage rounding are GPU-specific.
#include "kernels/cuda/activation.hpp"

#include "kernels/common/gelu_math.hpp"
#include "kernels/cuda/device_math.cuh"

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
    bias_gelu_backward_kernel<T><<<detail::grid_for(n), detail::block_threads, 0, stream>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), bias, n, c);
    return cudaGetLastError();
  });
}

} // namespace dsa::cuda
