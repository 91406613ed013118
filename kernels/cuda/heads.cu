// Layout copies for attention: a grid-stride loop over the destination's elements, so
// writes coalesce; reads come in runs of d consecutive elements. With d a multiple of 8 and
// aligned arrays, 8 elements per access and one index computation per 8 (the per-element
// 64-bit divisions held the first version to 11-16% of the copy bandwidth on an H200).
#include "kernels/cuda/heads.hpp"

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/vec8.cuh"

namespace dsa::cuda {
namespace {

template <class D, class S>
__global__ void split_heads_kernel(D* dst, const S* src, const float* bias, long long seq,
                                   long long heads, long long d, long long n) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long hidden = heads * d;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const long long j = i % d, t = (i / d) % seq, h = (i / (d * seq)) % heads,
                    b = i / (d * seq * heads);
    const long long col = h * d + j;
    float v = detail::to_float(src[(b * seq + t) * hidden + col]);
    if (bias)
      v += bias[col];
    dst[i] = detail::from_float<D>(v);
  }
}

template <class T>
__global__ void merge_heads_kernel(T* dst, const T* src, long long seq, long long heads,
                                   long long d, long long n) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long hidden = heads * d;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const long long col = i % hidden, row = i / hidden;
    const long long h = col / d, j = col % d, t = row % seq, b = row / seq;
    dst[i] = src[((b * heads + h) * seq + t) * d + j];
  }
}

template <class D, class S>
__global__ void split_heads_kernel8(D* dst, const S* src, const float* bias, long long seq,
                                    long long heads, long long d8, long long n8) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long hidden8 = heads * d8;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n8;
       i += stride) {
    const long long j8 = i % d8, rest = i / d8;
    const long long t = rest % seq, bh = rest / seq;
    const long long h = bh % heads, b = bh / heads;
    const long long col8 = h * d8 + j8;
    float v[8];
    detail::load8(v, src + 8 * ((b * seq + t) * hidden8 + col8));
    if (bias) {
      float add[8];
      detail::load8(add, bias + 8 * col8);
#pragma unroll
      for (int k = 0; k < 8; ++k)
        v[k] += add[k];
    }
    detail::store8(dst + 8 * i, v);
  }
}

template <class T>
__global__ void merge_heads_kernel8(T* dst, const T* src, long long seq, long long heads,
                                    long long d8, long long n8) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long hidden8 = heads * d8;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n8;
       i += stride) {
    const long long col8 = i % hidden8, row = i / hidden8;
    const long long h = col8 / d8, j8 = col8 % d8, t = row % seq, b = row / seq;
    *reinterpret_cast<detail::vec8<T>*>(dst + 8 * i) =
        *reinterpret_cast<const detail::vec8<T>*>(src + 8 * (((b * heads + h) * seq + t) * d8 + j8));
  }
}

bool bad_sizes(std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t d) {
  if (batch < 0 || seq <= 0 || heads <= 0 || d <= 0)
    return true;
  const std::int64_t limit = std::int64_t{1} << 62;
  return d > limit / heads || heads * d > limit / seq || (batch > 0 && heads * d * seq > limit / batch);
}

bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

} // namespace

cudaError_t split_heads(void* dst, elem dst_type, const void* src, elem src_type,
                        const float* bias, std::int64_t batch, std::int64_t seq,
                        std::int64_t heads, std::int64_t d, cudaStream_t stream) {
  if (!dst || !src || bad_sizes(batch, seq, heads, d))
    return cudaErrorInvalidValue;
  const std::int64_t n = batch * seq * heads * d;
  if (overlap(dst, static_cast<std::size_t>(n * elem_size(dst_type)), src,
              static_cast<std::size_t>(n * elem_size(src_type))))
    return cudaErrorInvalidValue;
  if (n == 0)
    return cudaSuccess;
  return detail::dispatch(dst_type, [&](auto dst_tag) {
    using D = decltype(dst_tag);
    return detail::dispatch(src_type, [&](auto src_tag) {
      using S = decltype(src_tag);
      if (d % 8 == 0 && detail::vec8_aligned<D>(dst) && detail::vec8_aligned<S>(src) &&
          detail::vec8_aligned<float>(bias))
        split_heads_kernel8<D, S><<<detail::grid_for8(n / 8), detail::block_threads, 0, stream>>>(
            static_cast<D*>(dst), static_cast<const S*>(src), bias, seq, heads, d / 8, n / 8);
      else
        split_heads_kernel<D, S><<<detail::grid_for(n), detail::block_threads, 0, stream>>>(
            static_cast<D*>(dst), static_cast<const S*>(src), bias, seq, heads, d, n);
      return cudaGetLastError();
    });
  });
}

cudaError_t merge_heads(void* dst, const void* src, elem type, std::int64_t batch,
                        std::int64_t seq, std::int64_t heads, std::int64_t d,
                        cudaStream_t stream) {
  if (!dst || !src || bad_sizes(batch, seq, heads, d))
    return cudaErrorInvalidValue;
  const std::int64_t n = batch * seq * heads * d;
  const auto bytes = static_cast<std::size_t>(n * elem_size(type));
  if (overlap(dst, bytes, src, bytes))
    return cudaErrorInvalidValue;
  if (n == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    if (d % 8 == 0 && detail::vec8_aligned<T>(dst) && detail::vec8_aligned<T>(src))
      merge_heads_kernel8<T><<<detail::grid_for8(n / 8), detail::block_threads, 0, stream>>>(
          static_cast<T*>(dst), static_cast<const T*>(src), seq, heads, d / 8, n / 8);
    else
      merge_heads_kernel<T><<<detail::grid_for(n), detail::block_threads, 0, stream>>>(
          static_cast<T*>(dst), static_cast<const T*>(src), seq, heads, d, n);
    return cudaGetLastError();
  });
}

} // namespace dsa::cuda
