// LayerNorm kernels: a block of detail::block_threads per row; each thread strides over
// the row, the block merges Welford partials (forward) or sums (backward).
#include "kernels/cuda/layernorm.hpp"

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/layernorm_backward.cuh"

namespace dsa::cuda {
namespace {

template <class T>
__global__ void layernorm_forward_kernel(T* y, float* mean, float* rstd, const T* x,
                                         const float* gamma, const float* beta, float eps,
                                         long long c) {
  __shared__ common::welford scratch[detail::warps_per_block];
  const long long row = blockIdx.x;
  const T* xr = x + row * c;
  T* yr = y + row * c;
  common::welford w;
  for (long long j = threadIdx.x; j < c; j += blockDim.x)
    w = common::welford_add(w, detail::to_float(xr[j]));
  w = detail::block_welford(w, scratch);
  const float s = common::welford_rstd(w, eps);
  // Every thread has read its own elements above, so writing y in place is safe.
  for (long long j = threadIdx.x; j < c; j += blockDim.x)
    yr[j] = detail::from_float<T>(
        common::layernorm_normalize(detail::to_float(xr[j]), w.mean, s, gamma[j], beta[j]));
  if (threadIdx.x == 0) {
    mean[row] = w.mean;
    rstd[row] = s;
  }
}

template <class T>
__global__ void layernorm_backward_kernel(T* dx, float* dgamma, float* dbeta, const T* dy,
                                          const T* x, const float* mean, const float* rstd,
                                          const float* gamma, long long c) {
  __shared__ float scratch[detail::warps_per_block];
  const long long row = blockIdx.x;
  const T* dyr = dy + row * c;
  const T* xr = x + row * c;
  T* dxr = dx + row * c;
  const float m = mean[row], s = rstd[row];
  const detail::layernorm_row_means means = detail::layernorm_backward_row_means(
      detail::layernorm_atomic_sums{dgamma, dbeta},
      [&](long long j) { return detail::to_float(dyr[j]); }, xr, m, s, gamma, c, scratch);
  // Each thread rewrites only the elements it read, so dx may alias dy.
  for (long long j = threadIdx.x; j < c; j += blockDim.x)
    dxr[j] = detail::from_float<T>(
        detail::layernorm_backward_dx(detail::to_float(dyr[j]), xr, gamma, j, m, s, means));
}

bool bad_sizes(std::int64_t rows, std::int64_t c) {
  return rows < 0 || rows > 2147483647LL || c <= 0;
}

} // namespace

cudaError_t layernorm_forward(void* y, float* mean, float* rstd, const void* x, const float* gamma,
                              const float* beta, float eps, elem type, std::int64_t rows,
                              std::int64_t c, cudaStream_t stream) {
  if (bad_sizes(rows, c) || !y || !mean || !rstd || !x || !gamma || !beta)
    return cudaErrorInvalidValue;
  if (rows == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    layernorm_forward_kernel<T><<<static_cast<unsigned>(rows), detail::block_threads, 0, stream>>>(
        static_cast<T*>(y), mean, rstd, static_cast<const T*>(x), gamma, beta, eps, c);
    return cudaGetLastError();
  });
}

cudaError_t layernorm_backward(void* dx, float* dgamma, float* dbeta, const void* dy, const void* x,
                               const float* mean, const float* rstd, const float* gamma, elem type,
                               std::int64_t rows, std::int64_t c, cudaStream_t stream) {
  if (bad_sizes(rows, c) || !dx || !dy || !x || !mean || !rstd || !gamma)
    return cudaErrorInvalidValue;
  if (rows == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    layernorm_backward_kernel<T><<<static_cast<unsigned>(rows), detail::block_threads, 0, stream>>>(
        static_cast<T*>(dx), dgamma, dbeta, static_cast<const T*>(dy), static_cast<const T*>(x),
        mean, rstd, gamma, c);
    return cudaGetLastError();
  });
}

} // namespace dsa::cuda
