// Dropout: one thread per Philox block of four elements (one philox4x32 call each).
#include "kernels/cuda/dropout.hpp"

#include "kernels/common/dropout_math.hpp"
#include "kernels/cuda/device_math.cuh"

namespace dsa::cuda {
namespace {

template <class T>
__global__ void dropout_kernel(T* y, std::uint8_t* mask, const T* x, float p, float scale,
                               philox_stream rng, long long n) {
  const long long blocks = (n + 3) / 4;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long b = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; b < blocks;
       b += stride) {
    const std::array<float, 4> u = rng.uniform4(static_cast<std::uint32_t>(b));
    for (int k = 0; k < 4 && 4 * b + k < n; ++k) {
      const long long i = 4 * b + k;
      const bool keep = common::dropout_keep(u, k, p);
      y[i] = detail::from_float<T>(common::dropout_apply(detail::to_float(x[i]), keep, scale));
      if (mask)
        mask[i] = keep ? 1 : 0;
    }
  }
}

bool bad_args(float p, std::int64_t n) {
  return !(p >= 0.0f && p < 1.0f) || n < 0 || (n + 3) / 4 > (std::int64_t{1} << 32);
}

} // namespace

cudaError_t dropout_forward(void* y, std::uint8_t* mask, const void* x, float p,
                            const philox_stream& rng, elem type, std::int64_t n,
                            cudaStream_t stream) {
  if (bad_args(p, n) || !y || !x)
    return cudaErrorInvalidValue;
  if (n == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    dropout_kernel<T><<<detail::grid_for((n + 3) / 4), detail::block_threads, 0, stream>>>(
        static_cast<T*>(y), mask, static_cast<const T*>(x), p, 1.0f / (1.0f - p), rng, n);
    return cudaGetLastError();
  });
}

// The backward applies the same keep decision and scale to dy: the forward without a mask.
cudaError_t dropout_backward(void* dx, const void* dy, float p, const philox_stream& rng, elem type,
                             std::int64_t n, cudaStream_t stream) {
  return dropout_forward(dx, nullptr, dy, p, rng, type, n, stream);
}

} // namespace dsa::cuda
