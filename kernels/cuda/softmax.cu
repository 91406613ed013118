// Softmax with dropout: a block of detail::block_threads per row, each thread striding over
// the row. The forward reads the scores three times (maximum, sum of exponentials, output)
// rather than keeping a row of unknown length in shared memory; the backward reads its
// inputs twice (the dot product, then the output). Every thread writes only the elements it
// has read itself, so the in-place forms (probs over scores, dscores over ddropped) are safe.
// Dropout draws one Philox block per element, as residual_layernorm.cu does.
#include "kernels/cuda/softmax.hpp"

#include "kernels/common/dropout_math.hpp"
#include "kernels/cuda/device_math.cuh"

#include <cmath>

namespace dsa::cuda {
namespace {

// Maximum over a block of detail::block_threads threads; every thread gets the result.
// `scratch` holds warps_per_block values; syncs on both sides as detail::block_sum does.
__device__ __forceinline__ float block_max(float x, float* scratch) {
  for (int o = 16; o > 0; o >>= 1)
    x = fmaxf(x, __shfl_xor_sync(detail::full_mask, x, o));
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  __syncthreads();
  if (lane == 0)
    scratch[warp] = x;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < detail::warps_per_block; ++w)
    m = fmaxf(m, scratch[w]);
  return m;
}

// The CPU twin's arithmetic (kernels/cpu/softmax_impl.inc): v = scale * s, the row maximum
// over attended keys, e = exp(v - max), probs = e * (1 / sum e); a row whose maximum is -inf
// (no attended key) is all zeros.
template <class T>
__global__ void softmax_dropout_forward_kernel(T* probs, T* dropped, const T* scores,
                                               const float* key_mask, float scale, float p,
                                               float keep_scale, philox_stream rng,
                                               long long per_batch, long long tk) {
  __shared__ float scratch[detail::warps_per_block];
  const long long row = blockIdx.x;
  const long long first = row * tk;
  const float* mask = key_mask ? key_mask + (row / per_batch) * tk : nullptr;
  auto attended = [&](long long k) { return !mask || mask[k] != 0.0f; };
  const float ninf = -INFINITY;

  float mx = ninf;
  for (long long k = threadIdx.x; k < tk; k += blockDim.x)
    if (attended(k))
      mx = fmaxf(mx, scale * detail::to_float(scores[first + k]));
  mx = block_max(mx, scratch); // the same value in every thread, so `any` is block-uniform
  const bool any = mx != ninf;

  float sum = 0.0f;
  if (any)
    for (long long k = threadIdx.x; k < tk; k += blockDim.x)
      if (attended(k))
        sum += expf(scale * detail::to_float(scores[first + k]) - mx);
  sum = detail::block_sum(sum, scratch);
  const float inv = any ? 1.0f / sum : 0.0f;

  // scores[first + k] is read before probs[first + k] (which may alias it) is written.
  for (long long k = threadIdx.x; k < tk; k += blockDim.x) {
    const float prob =
        any && attended(k) ? expf(scale * detail::to_float(scores[first + k]) - mx) * inv : 0.0f;
    if (probs)
      probs[first + k] = detail::from_float<T>(prob);
    if (dropped) {
      const bool keep = common::dropout_keep_element(rng, static_cast<std::uint64_t>(first + k), p);
      dropped[first + k] = detail::from_float<T>(common::dropout_apply(prob, keep, keep_scale));
    }
  }
}

// dprobs as cpu::softmax_dropout_backward forms it (dropout_range on ddropped when
// dropping), then dot = sum dprobs * probs and dscores = scale * probs * (dprobs - dot).
template <class T>
__global__ void softmax_dropout_backward_kernel(T* dscores, const T* ddropped, const T* probs,
                                                float scale, bool drop, float p, float keep_scale,
                                                philox_stream rng, long long tk) {
  __shared__ float scratch[detail::warps_per_block];
  const long long first = static_cast<long long>(blockIdx.x) * tk;
  auto dprobs_at = [&](long long k) {
    const float g = detail::to_float(ddropped[first + k]);
    if (!drop)
      return g;
    const bool keep = common::dropout_keep_element(rng, static_cast<std::uint64_t>(first + k), p);
    return common::dropout_apply(g, keep, keep_scale);
  };

  float dot = 0.0f;
  for (long long k = threadIdx.x; k < tk; k += blockDim.x)
    dot += dprobs_at(k) * detail::to_float(probs[first + k]);
  dot = detail::block_sum(dot, scratch);

  // ddropped[first + k] is read before dscores[first + k] (which may alias it) is written.
  for (long long k = threadIdx.x; k < tk; k += blockDim.x) {
    const float pr = detail::to_float(probs[first + k]);
    dscores[first + k] = detail::from_float<T>(scale * pr * (dprobs_at(k) - dot));
  }
}

constexpr std::int64_t max_rows = 2147483647LL;          // gridDim.x
constexpr std::int64_t max_dropout_elements = 1LL << 34; // 2^32 Philox blocks of 4

// Sizes whose rows fit the grid and whose element count fits int64; false when bad.
bool good_sizes(std::int64_t rows, std::int64_t tk) {
  return rows >= 0 && rows <= max_rows && tk > 0 && (rows == 0 || tk <= INT64_MAX / rows);
}

// rows = batch * heads * tq without overflow; -1 when any size is negative or rows is too many.
std::int64_t rows_of(std::int64_t batch, std::int64_t heads, std::int64_t tq) {
  if (batch < 0 || heads < 0 || tq < 0)
    return -1;
  if (heads != 0 && batch > max_rows / heads)
    return -1;
  const std::int64_t bh = batch * heads;
  if (tq != 0 && bh > max_rows / tq)
    return -1;
  return bh * tq;
}

} // namespace

cudaError_t softmax_dropout_forward(void* probs, void* dropped, const void* scores,
                                    const float* key_mask, float scale, float p,
                                    const philox_stream& rng, elem type, std::int64_t batch,
                                    std::int64_t heads, std::int64_t tq, std::int64_t tk,
                                    cudaStream_t stream) {
  const std::int64_t rows = rows_of(batch, heads, tq);
  if (!good_sizes(rows, tk) || !scores || (!probs && !dropped))
    return cudaErrorInvalidValue;
  if (dropped && (!(p > 0.0f && p < 1.0f) || rows * tk > max_dropout_elements))
    return cudaErrorInvalidValue;
  if (rows == 0)
    return cudaSuccess;
  const float keep_scale = dropped ? 1.0f / (1.0f - p) : 1.0f;
  const std::int64_t per_batch = heads * tq; // > 0 since rows > 0
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    softmax_dropout_forward_kernel<T>
        <<<static_cast<unsigned>(rows), detail::block_threads, 0, stream>>>(
            static_cast<T*>(probs), static_cast<T*>(dropped), static_cast<const T*>(scores),
            key_mask, scale, p, keep_scale, rng, per_batch, tk);
    return cudaGetLastError();
  });
}

cudaError_t softmax_dropout_backward(void* dscores, const void* ddropped, const void* probs,
                                     float scale, float p, const philox_stream& rng, elem type,
                                     std::int64_t rows, std::int64_t tk, cudaStream_t stream) {
  if (!good_sizes(rows, tk) || !dscores || !ddropped || !probs || !(p >= 0.0f && p < 1.0f))
    return cudaErrorInvalidValue;
  const bool drop = p > 0.0f;
  if (drop && rows * tk > max_dropout_elements)
    return cudaErrorInvalidValue;
  if (rows == 0)
    return cudaSuccess;
  const float keep_scale = 1.0f / (1.0f - p);
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    softmax_dropout_backward_kernel<T>
        <<<static_cast<unsigned>(rows), detail::block_threads, 0, stream>>>(
            static_cast<T*>(dscores), static_cast<const T*>(ddropped), static_cast<const T*>(probs),
            scale, drop, p, keep_scale, rng, tk);
    return cudaGetLastError();
  });
}

} // namespace dsa::cuda
