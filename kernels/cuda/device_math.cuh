// Device-side helpers for the kernels: loads and stores of f32/f16/bf16 as f32, and
// warp / block reductions. Included by .cu files only.
#pragma once

#include "kernels/common/layernorm_math.hpp"
#include "kernels/cuda/elem.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace dsa::cuda::detail {

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <class T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <> __device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

constexpr unsigned full_mask = 0xffffffffu;
constexpr int block_threads = 256;
constexpr int warps_per_block = block_threads / 32;

template <class T> __device__ __forceinline__ T warp_sum(T x) {
  for (int o = 16; o > 0; o >>= 1)
    x += __shfl_xor_sync(full_mask, x, o);
  return x;
}

// Sum over a block of block_threads threads (float or double); every thread gets the result.
// `scratch` holds warps_per_block values; safe to call repeatedly (syncs on both sides).
template <class T> __device__ __forceinline__ T block_sum(T x, T* scratch) {
  x = warp_sum(x);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  __syncthreads();
  if (lane == 0)
    scratch[warp] = x;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < warps_per_block; ++w)
    total += scratch[w];
  return total;
}

// Maximum over a block of block_threads threads, NaNs skipped (fmaxf); every thread gets
// the result. `scratch` holds warps_per_block values; syncs on both sides as block_sum.
__device__ __forceinline__ float block_max(float x, float* scratch) {
  for (int o = 16; o > 0; o >>= 1)
    x = fmaxf(x, __shfl_xor_sync(full_mask, x, o));
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  __syncthreads();
  if (lane == 0)
    scratch[warp] = x;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < warps_per_block; ++w)
    m = fmaxf(m, scratch[w]);
  return m;
}

__device__ __forceinline__ common::welford shfl_welford(common::welford w, int offset) {
  common::welford o;
  o.count = __shfl_xor_sync(full_mask, w.count, offset);
  o.mean = __shfl_xor_sync(full_mask, w.mean, offset);
  o.m2 = __shfl_xor_sync(full_mask, w.m2, offset);
  return o;
}

// Welford statistics merged over the block with common::welford_merge.
__device__ __forceinline__ common::welford block_welford(common::welford w,
                                                         common::welford* scratch) {
  for (int o = 16; o > 0; o >>= 1)
    w = common::welford_merge(w, shfl_welford(w, o));
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  __syncthreads();
  if (lane == 0)
    scratch[warp] = w;
  __syncthreads();
  common::welford total;
  for (int k = 0; k < warps_per_block; ++k)
    total = common::welford_merge(total, scratch[k]);
  return total;
}

// Calls fn(T{}) with T the storage type of `type` (float, __half, __nv_bfloat16): the one
// place where a runtime elem becomes a template argument.
template <class Fn> cudaError_t dispatch(elem type, Fn&& fn) {
  switch (type) {
  case elem::f32:
    return fn(float{});
  case elem::f16:
    return fn(__half{});
  case elem::bf16:
    return fn(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

// Grid size for n elements at block_threads per block, capped (grid-stride loops cover the rest).
inline unsigned grid_for(long long n) {
  const long long blocks = (n + block_threads - 1) / block_threads;
  return static_cast<unsigned>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

} // namespace dsa::cuda::detail
