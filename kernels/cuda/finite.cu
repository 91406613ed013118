// Unscale + inf/NaN detection: each warp ORs its findings and one lane writes the flag,
// so a clean buffer costs no global writes beyond the gradients themselves.
#include "kernels/cuda/finite.hpp"

#include "kernels/common/adam_math.hpp"
#include "kernels/cuda/device_math.cuh"

namespace dsa::cuda {
namespace {

template <class T>
__global__ void unscale_kernel(T* grad, int* found, float inv_scale, long long n) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  bool bad = false;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const float g = detail::to_float(grad[i]);
    bad = bad || !common::is_finite_value(g);
    if (inv_scale != 1.0f)
      grad[i] = detail::from_float<T>(g * inv_scale);
  }
  if (__any_sync(detail::full_mask, bad) && threadIdx.x % 32 == 0)
    *found = 1;
}

} // namespace

cudaError_t unscale_and_check(void* grad, int* found_nonfinite, float inv_scale, elem type,
                              std::int64_t n, cudaStream_t stream) {
  if (n < 0 || !grad || !found_nonfinite)
    return cudaErrorInvalidValue;
  if (n == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    unscale_kernel<T><<<detail::grid_for(n), detail::block_threads, 0, stream>>>(
        static_cast<T*>(grad), found_nonfinite, inv_scale, n);
    return cudaGetLastError();
  });
}

} // namespace dsa::cuda
