// Bias + GELU kernels: grid-stride elementwise loops over (rows, c) calling the shared
// per-element math, so only indexing and storage rounding are GPU-specific.
#include "kernels/cuda/activation.hpp"

#include "kernels/common/gelu_math.hpp"
#include "kernels/cuda/device_math.cuh"

namespace dsa::cuda {
namespace {

template <class T>
__global__ void bias_gelu_forward_kernel(T* y, const T* x, const float* bias, long long n, long long c) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n; i += stride)
    y[i] = detail::from_float<T>(
        common::bias_gelu_forward_element(detail::to_float(x[i]), bias[i % c]));
}

template <class T>
__global__ void bias_gelu_backward_kernel(T* dx, const T* dy, const T* x, const float* bias, long long n,
                                          long long c) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n; i += stride)
    dx[i] = detail::from_float<T>(common::bias_gelu_backward_element(
        detail::to_float(dy[i]), detail::to_float(x[i]), bias[i % c]));
}

template <class T>
cudaError_t launch_forward(void* y, const void* x, const float* bias, long long n, long long c,
                           cudaStream_t stream) {
  bias_gelu_forward_kernel<T><<<detail::grid_for(n), detail::block_threads, 0, stream>>>(
      static_cast<T*>(y), static_cast<const T*>(x), bias, n, c);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_backward(void* dx, const void* dy, const void* x, const float* bias, long long n,
                            long long c, cudaStream_t stream) {
  bias_gelu_backward_kernel<T><<<detail::grid_for(n), detail::block_threads, 0, stream>>>(
      static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), bias, n, c);
  return cudaGetLastError();
}

} // namespace

cudaError_t bias_gelu_forward(void* y, const void* x, const float* bias, elem type, std::int64_t rows,
                              std::int64_t c, cudaStream_t stream) {
  if (rows < 0 || c <= 0 || !y || !x || !bias) return cudaErrorInvalidValue;
  const long long n = rows * c;
  if (n == 0) return cudaSuccess;
  switch (type) {
  case elem::f32: return launch_forward<float>(y, x, bias, n, c, stream);
  case elem::f16: return launch_forward<__half>(y, x, bias, n, c, stream);
  case elem::bf16: return launch_forward<__nv_bfloat16>(y, x, bias, n, c, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t bias_gelu_backward(void* dx, const void* dy, const void* x, const float* bias, elem type,
                               std::int64_t rows, std::int64_t c, cudaStream_t stream) {
  if (rows < 0 || c <= 0 || !dx || !dy || !x || !bias) return cudaErrorInvalidValue;
  const long long n = rows * c;
  if (n == 0) return cudaSuccess;
  switch (type) {
  case elem::f32: return launch_backward<float>(dx, dy, x, bias, n, c, stream);
  case elem::f16: return launch_backward<__half>(dx, dy, x, bias, n, c, stream);
  case elem::bf16: return launch_backward<__nv_bfloat16>(dx, dy, x, bias, n, c, stream);
  }
  return cudaErrorInvalidValue;
}

} // namespace dsa::cuda
