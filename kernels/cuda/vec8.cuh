// Eight consecutive elements moved as one aligned access (16 bytes for halves, two 16-byte
// accesses for f32), for the elementwise kernels whose rows are a multiple of 8 wide.
// Included by .cu files only.
#pragma once

#include "kernels/cuda/device_math.cuh"

#include <cstdint>

namespace dsa::cuda::detail {

template <class T> struct alignas(8 * sizeof(T)) vec8 {
  T v[8];
};

// Whether p can be read or written as vec8<T> (and so every multiple of 8 elements past it).
template <class T> inline bool vec8_aligned(const void* p) {
  return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % (8 * sizeof(T)) == 0;
}

template <class T> __device__ __forceinline__ void load8(float (&out)[8], const T* p) {
  const vec8<T> v = *reinterpret_cast<const vec8<T>*>(p);
#pragma unroll
  for (int k = 0; k < 8; ++k)
    out[k] = to_float(v.v[k]);
}

template <class T> __device__ __forceinline__ void store8(T* p, const float (&in)[8]) {
  vec8<T> v;
#pragma unroll
  for (int k = 0; k < 8; ++k)
    v.v[k] = from_float<T>(in[k]);
  *reinterpret_cast<vec8<T>*>(p) = v;
}

// Grid for n8 items of 8 elements at block_threads per block, capped as grid_for.
inline unsigned grid_for8(long long n8) { return grid_for(n8); }

} // namespace dsa::cuda::detail
