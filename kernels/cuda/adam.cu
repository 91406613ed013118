// Fused Adam kernel: a grid-stride loop calling common::adam_element, then the RNE
// conversion to f16/bf16 (the same rounding as core/half.hpp on the CPU).
#include "kernels/cuda/adam.hpp"

#include "kernels/cuda/device_math.cuh"

namespace dsa::cuda {
namespace {

template <class Half>
__global__ void adam_kernel(float* param, float* m, float* v, const float* grad, Half* half_out,
                            common::adam_consts c, long long n) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    float p = param[i], mm = m[i], vv = v[i];
    common::adam_element(p, mm, vv, grad[i], c);
    param[i] = p;
    m[i] = mm;
    v[i] = vv;
    if (half_out)
      half_out[i] = detail::from_float<Half>(p);
  }
}

} // namespace

cudaError_t adam_update(float* param, float* m, float* v, const float* grad,
                        std::uint16_t* half_out, elem half_type, const common::adam_consts& consts,
                        std::int64_t n, cudaStream_t stream) {
  if (n < 0 || !param || !m || !v || !grad)
    return cudaErrorInvalidValue;
  if (half_out && half_type == elem::f32)
    return cudaErrorInvalidValue;
  if (n == 0)
    return cudaSuccess;
  const unsigned grid = detail::grid_for(n);
  if (half_type == elem::bf16)
    adam_kernel<__nv_bfloat16><<<grid, detail::block_threads, 0, stream>>>(
        param, m, v, grad, reinterpret_cast<__nv_bfloat16*>(half_out), consts, n);
  else
    adam_kernel<__half><<<grid, detail::block_threads, 0, stream>>>(
        param, m, v, grad, reinterpret_cast<__half*>(half_out), consts, n);
  return cudaGetLastError();
}

} // namespace dsa::cuda
