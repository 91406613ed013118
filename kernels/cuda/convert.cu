// Conversions: a grid-stride loop, one rounding per element.
#include "kernels/cuda/convert.hpp"

#include "kernels/cuda/device_math.cuh"

namespace dsa::cuda {
namespace {

template <class D, class S>
__global__ void convert_kernel(D* dst, const S* src, long long n) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    dst[i] = detail::from_float<D>(detail::to_float(src[i]));
}

} // namespace

cudaError_t convert(void* dst, elem dst_type, const void* src, elem src_type, std::int64_t n,
                    cudaStream_t stream) {
  if (n < 0 || !dst || !src)
    return cudaErrorInvalidValue;
  if (n == 0 || (dst == src && dst_type == src_type))
    return cudaSuccess;
  const auto d = reinterpret_cast<std::uintptr_t>(dst), s = reinterpret_cast<std::uintptr_t>(src);
  const auto db = static_cast<std::uintptr_t>(n * elem_size(dst_type)),
             sb = static_cast<std::uintptr_t>(n * elem_size(src_type));
  if (d < s + sb && s < d + db)
    return cudaErrorInvalidValue;
  return detail::dispatch(dst_type, [&](auto dst_tag) {
    using D = decltype(dst_tag);
    return detail::dispatch(src_type, [&](auto src_tag) {
      using S = decltype(src_tag);
      convert_kernel<D, S><<<detail::grid_for(n), detail::block_threads, 0, stream>>>(
          static_cast<D*>(dst), static_cast<const S*>(src), n);
      return cudaGetLastError();
    });
  });
}

} // namespace dsa::cuda
