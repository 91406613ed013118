// Softmax with dropout, two kernels per direction, chosen by the row length tk.
//
// Rows of at most 1024 keys (1021 when tk % 4 != 0): one warp per row (two rows per warp up
// to 256 keys, for more loads in flight), the row held in registers and read once. Lane l's
// chunk c is Philox block first / 4 + 32 c + l (first = row * tk): the four row keys
// k = 4 (32 c + l) - first % 4 + j, j = 0..3, whose elements first + k are that block's, so
// one philox4x32 call gives the four uniforms dropout_keep_element would draw one by one.
// When tk % 4 == 0 (then first % 4 == 0) and every pointer is aligned to four elements, a
// chunk is one vector load or store; otherwise element by element with bounds checks. Slots
// outside the row take part in the warp shuffles as neutral values and are never stored.
//
// Longer rows: a block of detail::block_threads per row, each thread striding over the row.
// The forward reads the scores three times (maximum, sum of exponentials, output) rather
// than keeping a row of unknown length in shared memory; the backward reads its inputs
// twice (the dot product, then the output). Dropout draws one Philox block per element.
//
// In both, every thread writes only the elements it has read itself, after reading them, so
// the in-place forms (probs over scores, dscores over ddropped) are safe.
#include "kernels/cuda/softmax.hpp"

#include "kernels/common/dropout_math.hpp"
#include "kernels/cuda/device_math.cuh"

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace dsa::cuda {
namespace {

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
  mx = detail::block_max(mx, scratch); // the same value in every thread, so `any` is block-uniform
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

// ---- Rows in registers, one warp per row ----

constexpr int warp_block_warps = 4; // rows of warps per block
constexpr int warp_block_threads = 32 * warp_block_warps;
constexpr float ninf = -INFINITY;

// Rows per warp for a row of `chunks` chunks per lane: two for short rows.
constexpr int warp_rows(int chunks) {
  return chunks <= 2 ? 2 : 1;
}

// Four consecutive elements at p, aligned to four elements, as f32 in one load; store4 is
// the reverse, rounding as detail::from_float does.
__device__ __forceinline__ void load4(float (&x)[4], const float* p) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  x[0] = v.x;
  x[1] = v.y;
  x[2] = v.z;
  x[3] = v.w;
}
__device__ __forceinline__ float half_to_float(unsigned bits, __half) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xffffu)));
}
__device__ __forceinline__ float half_to_float(unsigned bits, __nv_bfloat16) {
  return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(bits & 0xffffu)));
}
__device__ __forceinline__ unsigned float_to_half(float x, __half) {
  return __half_as_ushort(__float2half_rn(x));
}
__device__ __forceinline__ unsigned float_to_half(float x, __nv_bfloat16) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
// __half and __nv_bfloat16: element 0 in the low 16 bits of the first word (little endian).
template <class T> __device__ __forceinline__ void load4(float (&x)[4], const T* p) {
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  x[0] = half_to_float(v.x, T{});
  x[1] = half_to_float(v.x >> 16, T{});
  x[2] = half_to_float(v.y, T{});
  x[3] = half_to_float(v.y >> 16, T{});
}
__device__ __forceinline__ void store4(float* p, const float (&x)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
}
template <class T> __device__ __forceinline__ void store4(T* p, const float (&x)[4]) {
  uint2 v;
  v.x = float_to_half(x[0], T{}) | float_to_half(x[1], T{}) << 16;
  v.y = float_to_half(x[2], T{}) | float_to_half(x[3], T{}) << 16;
  *reinterpret_cast<uint2*>(p) = v;
}

// Chunk c of a lane: slot j is row key `key + j` and element `element + j` of the tensor,
// element = 4 * (its Philox block); in[j] when that key lies in a live row.
struct chunk {
  long long element;
  int key; // negative for slots before the row (first % 4 of them, in the first chunk)
  bool in[4];
};

// Vector: tk % 4 == 0, so first % 4 == 0 and a chunk lies wholly inside or outside the row.
template <bool Vector>
__device__ __forceinline__ chunk chunk_of(long long first, bool live, long long tk, int c) {
  const int q = 32 * c + static_cast<int>(threadIdx.x) % 32;
  chunk h;
  h.key = 4 * q - (Vector ? 0 : static_cast<int>(first & 3));
  h.element = first + h.key;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    h.in[j] = live && (Vector ? h.key < tk : h.key + j >= 0 && h.key + j < tk);
  return h;
}

// x[j] = row[key + j] as f32 where in[j], else `fill`; row = base + first.
template <bool Vector, class T>
__device__ __forceinline__ void load_chunk(float (&x)[4], const T* base, long long first,
                                           const chunk& h, float fill) {
  if (Vector) {
    if (h.in[0]) {
      load4(x, base + (first + h.key));
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        x[j] = fill;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      x[j] = h.in[j] ? detail::to_float(base[first + h.key + j]) : fill;
  }
}

// row[key + j] = y[j] rounded to T where in[j]; row = base + first.
template <bool Vector, class T>
__device__ __forceinline__ void store_chunk(T* base, long long first, const chunk& h,
                                            const float (&y)[4]) {
  if (Vector) {
    if (h.in[0])
      store4(base + (first + h.key), y);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (h.in[j])
        base[first + h.key + j] = detail::from_float<T>(y[j]);
  }
}

// Bit 4c + j set iff the dropout keeps element h.element + j: dropout_keep_element's
// decision, from one Philox block (none drawn for a chunk outside the row).
__device__ __forceinline__ unsigned keep_bits(const philox_stream& rng, const chunk& h, float p,
                                              int c) {
  if (!(h.in[0] || h.in[1] || h.in[2] || h.in[3]))
    return 0u;
  const std::array<float, 4> u = rng.uniform4(static_cast<std::uint32_t>(h.element >> 2));
  unsigned bits = 0u;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (common::dropout_keep(u, j, p))
      bits |= 1u << (4 * c + j);
  return bits;
}

__device__ __forceinline__ bool kept(unsigned bits, int i) {
  return ((bits >> i) & 1u) != 0u;
}

// The block kernel's arithmetic with the row in registers: v = scale * s (-inf for masked
// keys and empty slots), max by shuffles, e = exp(v - max), probs = e * (1 / sum e).
// Rows rows per warp, warp_block_warps warps per block; row >= rows is skipped (warp-uniform).
template <class T, int Chunks, int Rows, bool Vector>
__global__ void __launch_bounds__(warp_block_threads)
    softmax_dropout_forward_warp(T* probs, T* dropped, const T* scores, const float* key_mask,
                                 float scale, float p, float keep_scale, philox_stream rng,
                                 long long rows, long long per_batch, long long tk) {
  constexpr int n = 4 * Chunks; // at most 32: the keep bits fit an unsigned
  const long long row0 =
      (static_cast<long long>(blockIdx.x) * warp_block_warps + threadIdx.x / 32) * Rows;
  float v[Rows][n];
  unsigned keep[Rows];
#pragma unroll
  for (int r = 0; r < Rows; ++r) {
    const long long row = row0 + r, first = row * tk;
    const bool live = row < rows;
    // The batch by a 32-bit division (row < rows + 8 <= 2^31 + 7), cheaper than 64 bits.
    const unsigned batch =
        key_mask ? static_cast<unsigned>(row) / static_cast<unsigned>(per_batch) : 0u;
    const long long mask_first = batch * tk;
#pragma unroll
    for (int c = 0; c < Chunks; ++c) {
      const chunk h = chunk_of<Vector>(first, live, tk, c);
      float s[4], m[4] = {1.0f, 1.0f, 1.0f, 1.0f};
      load_chunk<Vector>(s, scores, first, h, 0.0f);
      if (key_mask)
        load_chunk<Vector>(m, key_mask, mask_first, h, 1.0f);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        v[r][4 * c + j] = h.in[j] && m[j] != 0.0f ? scale * s[j] : ninf;
    }
  }
  // The uniforms while the loads are in flight.
#pragma unroll
  for (int r = 0; r < Rows; ++r) {
    const long long row = row0 + r, first = row * tk;
    keep[r] = 0u;
    if (dropped) {
#pragma unroll
      for (int c = 0; c < Chunks; ++c)
        keep[r] |= keep_bits(rng, chunk_of<Vector>(first, row < rows, tk, c), p, c);
    }
  }

  float mx[Rows], sum[Rows];
#pragma unroll
  for (int r = 0; r < Rows; ++r) {
    mx[r] = ninf;
#pragma unroll
    for (int i = 0; i < n; ++i)
      mx[r] = fmaxf(mx[r], v[r][i]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int r = 0; r < Rows; ++r)
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(detail::full_mask, mx[r], o));
#pragma unroll
  for (int r = 0; r < Rows; ++r) {
    // mx is the same in every lane. A row without an attended key (mx == -inf) is all zeros;
    // an empty slot or masked key is 0 without computing exp(-inf - mx).
    const bool any = mx[r] != ninf;
    sum[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < n; ++i) {
      v[r][i] = any && v[r][i] != ninf ? expf(v[r][i] - mx[r]) : 0.0f;
      sum[r] += v[r][i];
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int r = 0; r < Rows; ++r)
      sum[r] += __shfl_xor_sync(detail::full_mask, sum[r], o);

#pragma unroll
  for (int r = 0; r < Rows; ++r) {
    const long long row = row0 + r, first = row * tk;
    const float inv = mx[r] != ninf ? 1.0f / sum[r] : 0.0f;
#pragma unroll
    for (int c = 0; c < Chunks; ++c) {
      const chunk h = chunk_of<Vector>(first, row < rows, tk, c);
      float prob[4], drop[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        prob[j] = v[r][4 * c + j] * inv;
        drop[j] = common::dropout_apply(prob[j], kept(keep[r], 4 * c + j), keep_scale);
      }
      if (probs)
        store_chunk<Vector>(probs, first, h, prob);
      if (dropped)
        store_chunk<Vector>(dropped, first, h, drop);
    }
  }
}

// The block kernel's arithmetic with the rows in registers: dprobs = ddropped through the
// mask, dot by shuffles, dscores = scale * probs * (dprobs - dot). Empty slots are 0.
template <class T, int Chunks, int Rows, bool Vector>
__global__ void __launch_bounds__(warp_block_threads)
    softmax_dropout_backward_warp(T* dscores, const T* ddropped, const T* probs, float scale,
                                  bool drop, float p, float keep_scale, philox_stream rng,
                                  long long rows, long long tk) {
  constexpr int n = 4 * Chunks;
  const long long row0 =
      (static_cast<long long>(blockIdx.x) * warp_block_warps + threadIdx.x / 32) * Rows;
  float g[Rows][n], pr[Rows][n];
#pragma unroll
  for (int r = 0; r < Rows; ++r) {
    const long long row = row0 + r, first = row * tk;
#pragma unroll
    for (int c = 0; c < Chunks; ++c) {
      const chunk h = chunk_of<Vector>(first, row < rows, tk, c);
      float a[4], b[4];
      load_chunk<Vector>(a, ddropped, first, h, 0.0f);
      load_chunk<Vector>(b, probs, first, h, 0.0f);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        g[r][4 * c + j] = a[j];
        pr[r][4 * c + j] = b[j];
      }
    }
  }
  float dot[Rows];
#pragma unroll
  for (int r = 0; r < Rows; ++r) {
    const long long row = row0 + r, first = row * tk;
    if (drop) {
#pragma unroll
      for (int c = 0; c < Chunks; ++c) {
        const unsigned keep = keep_bits(rng, chunk_of<Vector>(first, row < rows, tk, c), p, c);
#pragma unroll
        for (int j = 0; j < 4; ++j)
          g[r][4 * c + j] =
              common::dropout_apply(g[r][4 * c + j], kept(keep, 4 * c + j), keep_scale);
      }
    }
    dot[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < n; ++i)
      dot[r] += g[r][i] * pr[r][i];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int r = 0; r < Rows; ++r)
      dot[r] += __shfl_xor_sync(detail::full_mask, dot[r], o);

#pragma unroll
  for (int r = 0; r < Rows; ++r) {
    const long long row = row0 + r, first = row * tk;
#pragma unroll
    for (int c = 0; c < Chunks; ++c) {
      const chunk h = chunk_of<Vector>(first, row < rows, tk, c);
      float ds[4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
        ds[j] = scale * pr[r][4 * c + j] * (g[r][4 * c + j] - dot[r]);
      store_chunk<Vector>(dscores, first, h, ds);
    }
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

// Chunks per lane for rows of tk keys on the warp kernels (32 * chunks Philox blocks per row,
// one more when tk % 4 != 0 and the row starts inside a block), or 0: the block kernels.
int warp_chunks(std::int64_t tk) {
  const std::int64_t blocks = tk % 4 == 0 ? tk / 4 : (tk + 3 + 3) / 4;
  for (int chunks : {1, 2, 3, 4, 6, 8})
    if (blocks <= 32 * chunks)
      return chunks;
  return 0;
}

// Whether p (possibly null) is aligned to `bytes`.
bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// fn(std::integral_constant<int, Chunks>, std::bool_constant<Vector>) for chunks, one of
// warp_chunks' values.
template <int Chunks, class Fn> cudaError_t with_vector(bool vector, Fn& fn) {
  if (vector)
    return fn(std::integral_constant<int, Chunks>{}, std::true_type{});
  return fn(std::integral_constant<int, Chunks>{}, std::false_type{});
}
template <class Fn> cudaError_t with_layout(int chunks, bool vector, Fn&& fn) {
  switch (chunks) {
  case 1:
    return with_vector<1>(vector, fn);
  case 2:
    return with_vector<2>(vector, fn);
  case 3:
    return with_vector<3>(vector, fn);
  case 4:
    return with_vector<4>(vector, fn);
  case 6:
    return with_vector<6>(vector, fn);
  case 8:
    return with_vector<8>(vector, fn);
  }
  return cudaErrorInvalidValue;
}

// Blocks of warp_block_warps warps, each `rows_per_warp` rows.
unsigned warp_grid(std::int64_t rows, int rows_per_warp) {
  const std::int64_t per_block = std::int64_t{warp_block_warps} * rows_per_warp;
  return static_cast<unsigned>((rows + per_block - 1) / per_block);
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
  const int chunks = warp_chunks(tk);
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    auto* probs_t = static_cast<T*>(probs);
    auto* dropped_t = static_cast<T*>(dropped);
    const auto* scores_t = static_cast<const T*>(scores);
    if (chunks == 0) {
      softmax_dropout_forward_kernel<T>
          <<<static_cast<unsigned>(rows), detail::block_threads, 0, stream>>>(
              probs_t, dropped_t, scores_t, key_mask, scale, p, keep_scale, rng, per_batch, tk);
      return cudaGetLastError();
    }
    const std::size_t quad = 4 * sizeof(T);
    const bool vector = tk % 4 == 0 && aligned(probs, quad) && aligned(dropped, quad) &&
                        aligned(scores, quad) && aligned(key_mask, 16);
    return with_layout(chunks, vector, [&](auto chunks_c, auto vector_c) {
      constexpr int c = decltype(chunks_c)::value, r = warp_rows(c);
      softmax_dropout_forward_warp<T, c, r, decltype(vector_c)::value>
          <<<warp_grid(rows, r), warp_block_threads, 0, stream>>>(probs_t, dropped_t, scores_t,
                                                                  key_mask, scale, p, keep_scale,
                                                                  rng, rows, per_batch, tk);
      return cudaGetLastError();
    });
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
  const int chunks = warp_chunks(tk);
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    auto* dscores_t = static_cast<T*>(dscores);
    const auto* ddropped_t = static_cast<const T*>(ddropped);
    const auto* probs_t = static_cast<const T*>(probs);
    if (chunks == 0) {
      softmax_dropout_backward_kernel<T>
          <<<static_cast<unsigned>(rows), detail::block_threads, 0, stream>>>(
              dscores_t, ddropped_t, probs_t, scale, drop, p, keep_scale, rng, tk);
      return cudaGetLastError();
    }
    const std::size_t quad = 4 * sizeof(T);
    const bool vector =
        tk % 4 == 0 && aligned(dscores, quad) && aligned(ddropped, quad) && aligned(probs, quad);
    return with_layout(chunks, vector, [&](auto chunks_c, auto vector_c) {
      constexpr int c = decltype(chunks_c)::value, r = warp_rows(c);
      softmax_dropout_backward_warp<T, c, r, decltype(vector_c)::value>
          <<<warp_grid(rows, r), warp_block_threads, 0, stream>>>(
              dscores_t, ddropped_t, probs_t, scale, drop, p, keep_scale, rng, rows, tk);
      return cudaGetLastError();
    });
  });
}

} // namespace dsa::cuda
