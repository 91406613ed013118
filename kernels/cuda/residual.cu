// Elementwise kernels: a thread per element, grid-stride.
#include "kernels/cuda/residual.hpp"

#include "kernels/common/dropout_math.hpp"
#include "kernels/common/residual_layernorm_math.hpp"
#include "kernels/cuda/device_math.cuh"

namespace dsa::cuda {
namespace {

template <class T>
__global__ void bias_dropout_residual_kernel(T* y, const T* x, const float* bias, const T* residual, float p,
                                             float scale, philox_stream rng, long long n, long long c) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const bool keep = common::dropout_keep_element(rng, static_cast<std::uint64_t>(i), p);
    y[i] = detail::from_float<T>(common::residual_sum_element(detail::to_float(x[i]), bias[i % c],
                                                              detail::to_float(residual[i]), keep, scale));
  }
}

template <class T> __global__ void add_into_kernel(T* y, const T* x, long long n) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n; i += stride)
    y[i] = detail::from_float<T>(detail::to_float(y[i]) + detail::to_float(x[i]));
}

template <class T>
__global__ void layernorm_invert_kernel(T* x, const T* y, const float* mean, const float* rstd, const float* gamma,
                                        const float* beta, long long n, long long c) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const long long r = i / c, j = i % c;
    const float xhat = (detail::to_float(y[i]) - beta[j]) * (1.0f / gamma[j]);
    x[i] = detail::from_float<T>(xhat / rstd[r] + mean[r]);
  }
}

} // namespace

cudaError_t layernorm_invert(void* x, const void* y, const float* mean, const float* rstd, const float* gamma,
                             const float* beta, elem type, std::int64_t rows, std::int64_t c, cudaStream_t stream) {
  if (!x || !y || !mean || !rstd || !gamma || !beta || rows < 0 || c <= 0 || rows > (std::int64_t{1} << 62) / c)
    return cudaErrorInvalidValue;
  const std::int64_t n = rows * c;
  if (n == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    layernorm_invert_kernel<T><<<detail::grid_for(n), detail::block_threads, 0, stream>>>(
        static_cast<T*>(x), static_cast<const T*>(y), mean, rstd, gamma, beta, n, c);
    return cudaGetLastError();
  });
}

cudaError_t bias_dropout_residual(void* y, const void* x, const float* bias, const void* residual, float p,
                                  const philox_stream& rng, elem type, std::int64_t rows, std::int64_t c,
                                  cudaStream_t stream) {
  if (!y || !x || !bias || !residual || rows < 0 || c <= 0 || !(p >= 0.0f && p < 1.0f) ||
      (rows > 0 && c > (std::int64_t{1} << 34) / rows))
    return cudaErrorInvalidValue;
  const std::int64_t n = rows * c;
  if (n == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    bias_dropout_residual_kernel<T><<<detail::grid_for(n), detail::block_threads, 0, stream>>>(
        static_cast<T*>(y), static_cast<const T*>(x), bias, static_cast<const T*>(residual), p, 1.0f / (1.0f - p),
        rng, n, c);
    return cudaGetLastError();
  });
}

cudaError_t add_into(void* y, const void* x, elem type, std::int64_t n, cudaStream_t stream) {
  if (!y || !x || n < 0)
    return cudaErrorInvalidValue;
  if (n == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    add_into_kernel<T><<<detail::grid_for(n), detail::block_threads, 0, stream>>>(static_cast<T*>(y),
                                                                                 static_cast<const T*>(x), n);
    return cudaGetLastError();
  });
}

} // namespace dsa::cuda
