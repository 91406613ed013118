// Fused bias + dropout + residual + LayerNorm, forward and backward, two kernels each.
//
// Rows in registers (c a multiple of 8 up to 4096, the row pointers aligned to 8 elements):
// a row is split into vectors of 8 elements (one 16-byte access for f16/bf16, two for f32);
// thread t of the row's G = 32 W threads holds vectors t, t + G, ..., K of them (the (W, K)
// of forward_splits / backward_splits), so each warp access covers contiguous memory. Each
// row is read once and written once. Dropout: vector q's elements first + 8 q .. + 7
// (first = r c, a multiple of 8) are Philox blocks (first + 8 q) / 4 and the next, drawn
// with the stream's round keys worked out once (dropout_plan): the decisions of
// dropout_keep_element, bit for bit; p == 0 keeps every element without drawing. Slots
// past the row take part in the reductions as zeros and are never stored. bias, gamma and
// beta go 4 floats per load when 16-byte aligned, else one at a time.
//  - Forward: a block of W warps per row (four rows of one warp when W = 1). v is formed
//    once; mean = sum v / c and m2 = sum (v - mean)^2 in two passes over the registers
//    (warp shuffles, then shared memory across the row's warps), rstd by
//    common::welford_rstd: the statistics differ from the serial Welford twin only by f32
//    rounding order.
//  - Backward: blocks of about 512 threads in row groups of W warps. A block takes a run of
//    rows; each step of a group takes two of them (rows g, g + groups of the step) and loads
//    the next step's while it finishes these. A group sums dxhat and dxhat xhat with
//    shuffles and, across its warps, one named barrier per step (the scratch alternating
//    between two halves); every group of a block takes the same number of steps, so all
//    pass the same barriers. Each thread keeps its columns' dgamma, dbeta and dbias terms
//    in registers over all of its rows; at the end the groups add theirs in turn into
//    shared memory (thread-major: no bank conflicts), and the block adds each column to the
//    global sums with one f32 atomic. The grid is one wave of resident blocks, so the
//    atomics number 3 c per block, not per row.
//
// Other shapes: a block of detail::block_threads per row, each thread striding over the row.
// The forward's first pass forms v and its Welford statistics, the second forms v again
// (the same arithmetic, so the same value) and writes; each element draws its own Philox
// block. The backward takes up to 32 rows per block: per row, the first pass sums the row's
// dxhat and dxhat xhat, the second forms dsum, stores it, applies the regenerated mask and
// stores dx; the column sums build up in shared memory over the block's rows and reach the
// global sums through one f32 atomic per column and block.
//
// In every kernel a thread writes only elements it has read itself, after reading them, so
// y may alias residual and dresidual may alias dy. The order of the column atomics varies
// from run to run; the row reductions do not, so dresidual and dx are reproducible.
//
// H200, bf16, p = 0.1, rows 8192 (BERT-large at batch 64, seq 128), % of the device copy's
// bandwidth (a 32 MB copy itself reaches 67-70%): c = 1024 forward 57% (was 12%), backward
// 54% (was 12%); at 65536 rows 81% and 77%; c = 768: 55% and 45%; c = 4096: 71% and 63%.
#include "kernels/cuda/residual_layernorm.hpp"

#include "kernels/common/residual_layernorm_math.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/layernorm_backward.cuh"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace dsa::cuda {
namespace {

// ---- Rows in registers ----

constexpr int vec = 8;                     // elements per vector
constexpr int backward_max_columns = 4096; // 3 c f32 column sums in 48 KB of shared memory

// Rows per forward block: four rows of one warp each, or one row of W warps.
constexpr int forward_rows_per_block(int warps) {
  return warps == 1 ? 4 : 1;
}

// 16-bit storage: element 2i in the low half of word i (little endian).
__device__ __forceinline__ float bits_to_float(unsigned bits, __half) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xffffu)));
}
__device__ __forceinline__ float bits_to_float(unsigned bits, __nv_bfloat16) {
  return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(bits & 0xffffu)));
}
__device__ __forceinline__ unsigned float_to_bits(float x, __half) {
  return __half_as_ushort(detail::from_float<__half>(x));
}
__device__ __forceinline__ unsigned float_to_bits(float x, __nv_bfloat16) {
  return __bfloat16_as_ushort(detail::from_float<__nv_bfloat16>(x));
}

// One vector of a row as 8 floats, in one 16-byte load (two for f32); p aligned to 8 elements.
template <class T> __device__ __forceinline__ void load_vector(float (&out)[vec], const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else {
    const uint4 r = *reinterpret_cast<const uint4*>(p);
    const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = bits_to_float(w[i], T{});
      out[2 * i + 1] = bits_to_float(w[i] >> 16, T{});
    }
  }
}

// The reverse, rounding as detail::from_float does.
template <class T> __device__ __forceinline__ void store_vector(T* p, const float (&in)[vec]) {
  if constexpr (std::is_same_v<T, float>) {
    reinterpret_cast<float4*>(p)[0] = make_float4(in[0], in[1], in[2], in[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(in[4], in[5], in[6], in[7]);
  } else {
    unsigned w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = float_to_bits(in[2 * i], T{}) | (float_to_bits(in[2 * i + 1], T{}) << 16);
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// A row vector's raw bits, loaded ahead and converted later (the backward's next row).
struct raw_vector {
  uint4 a, b; // b: f32 only
};
template <class T> __device__ __forceinline__ raw_vector load_raw(const T* p) {
  raw_vector r;
  r.a = reinterpret_cast<const uint4*>(p)[0];
  r.b = std::is_same_v<T, float> ? reinterpret_cast<const uint4*>(p)[1] : make_uint4(0, 0, 0, 0);
  return r;
}
template <class T> __device__ __forceinline__ void unpack(float (&out)[vec], const raw_vector& r) {
  const unsigned w[8] = {r.a.x, r.a.y, r.a.z, r.a.w, r.b.x, r.b.y, r.b.z, r.b.w};
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      out[i] = __uint_as_float(w[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = bits_to_float(w[i], T{});
      out[2 * i + 1] = bits_to_float(w[i] >> 16, T{});
    }
  }
}

// Backward blocks: about 512 threads in row groups of W warps; each group takes R rows per
// step (their loads made during the step before).
constexpr int backward_groups(int warps) {
  return warps < 16 ? 16 / warps : 1;
}
constexpr int backward_block_threads(int warps) {
  return backward_groups(warps) * 32 * warps;
}
constexpr int backward_rows_per_step = 2;

// The loads of one row for the backward (a thread's vectors of dy and sum), made ahead.
template <int K> struct row_loads {
  raw_vector dy[K], sum[K];
  float mean, rstd;
};

// 8 consecutive f32 columns (bias, gamma, beta), 4 per load when `aligned` (16 bytes).
__device__ __forceinline__ void load_columns(float (&out)[vec], const float* p, bool aligned) {
  if (aligned) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < vec; ++i)
      out[i] = __ldg(p + i);
  }
}

// Philox4x32-10 (core/philox.hpp) for the blocks of one stream, with what all its blocks
// share worked out once on the host: the round keys, and of the first round the words that
// do not depend on the block number (counter words 1..3 are the stream's). Together with
// an integer form of dropout_keep's test (see make_dropout_plan) this takes about half the
// instructions of philox_stream::uniform4 and dropout_keep; the decisions are the same.
struct dropout_plan {
  // Round 0 gives {first0, first1, hi(m0 b) ^ first2, lo(m0 b)} for block b.
  std::uint32_t first0, first1, first2;
  std::uint32_t key0[9], key1[9]; // the keys of rounds 1..9
  std::uint32_t keep_from;        // an element is kept iff its word >= keep_from
};

constexpr std::uint32_t philox_m0 = 0xD2511F53u, philox_m1 = 0xCD9E8D57u;

// dropout_keep keeps element i of block b iff u_i = float(r_i >> 8) 2^-24 >= p (r = the
// block's words). float(r_i >> 8) is exact (24 bits) and so are the scalings by powers of
// two, so u_i >= p <=> (r_i >> 8) >= p 2^24 <=> (r_i >> 8) >= ceil(p 2^24) <=> r_i >=
// ceil(p 2^24) 2^8, which fits 32 bits as p < 1. p == 0 gives keep_from == 0: all kept.
dropout_plan make_dropout_plan(const philox_stream& rng, float p) {
  const philox_key k = rng.key();
  const philox_counter c = rng.counter(0);
  const std::uint64_t p1 = static_cast<std::uint64_t>(philox_m1) * c[2];
  dropout_plan plan{};
  plan.first0 = static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k[0];
  plan.first1 = static_cast<std::uint32_t>(p1);
  plan.first2 = c[3] ^ k[1];
  std::uint32_t k0 = k[0], k1 = k[1];
  for (int r = 0; r < 9; ++r) {
    k0 += 0x9E3779B9u; // as philox4x32 steps its key after each round
    k1 += 0xBB67AE85u;
    plan.key0[r] = k0;
    plan.key1[r] = k1;
  }
  plan.keep_from = static_cast<std::uint32_t>(std::ceil(p * 16777216.0f)) << 8;
  return plan;
}

// The four words of Philox block `block`: philox4x32(rng.counter(block), rng.key()).
__device__ __forceinline__ uint4 philox_block(const dropout_plan& plan, std::uint32_t block) {
  std::uint32_t c0 = plan.first0, c1 = plan.first1;
  std::uint32_t c2 = __umulhi(philox_m0, block) ^ plan.first2, c3 = philox_m0 * block;
#pragma unroll
  for (int r = 0; r < 9; ++r) {
    const std::uint32_t hi0 = __umulhi(philox_m0, c0), lo0 = philox_m0 * c0;
    const std::uint32_t hi1 = __umulhi(philox_m1, c2), lo1 = philox_m1 * c2;
    c0 = hi1 ^ c1 ^ plan.key0[r];
    c1 = lo1;
    c2 = hi0 ^ c3 ^ plan.key1[r];
    c3 = lo0;
  }
  return make_uint4(c0, c1, c2, c3);
}

// Dropout decisions of elements e .. e + 7 of the stream (e a multiple of 4): those of
// dropout_keep_element, from two Philox blocks. keep_from == 0 (p == 0) keeps all.
__device__ __forceinline__ void keep_vector(bool (&keep)[vec], const dropout_plan& plan,
                                            std::uint64_t e) {
#pragma unroll
  for (int h = 0; h < vec; h += 4) {
    if (plan.keep_from != 0) {
      const uint4 r =
          philox_block(plan, static_cast<std::uint32_t>((e + static_cast<unsigned>(h)) >> 2));
      keep[h] = r.x >= plan.keep_from;
      keep[h + 1] = r.y >= plan.keep_from;
      keep[h + 2] = r.z >= plan.keep_from;
      keep[h + 3] = r.w >= plan.keep_from;
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        keep[h + i] = true;
    }
  }
}

// Sum over the row's W warps (W == 1: the warp); every thread of the row gets it. W > 1
// means one row per block, so the block's barriers are the row's.
template <int W> __device__ __forceinline__ float row_sum(float x, float* scratch) {
  x = detail::warp_sum(x);
  if constexpr (W == 1) {
    return x;
  } else {
    __syncthreads(); // the previous call's readers are done
    if (threadIdx.x % 32 == 0)
      scratch[threadIdx.x / 32] = x;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w)
      total += scratch[w];
    return total;
  }
}

template <class T, int K, int W>
__global__ void __launch_bounds__(32 * W * forward_rows_per_block(W))
    residual_layernorm_rows_kernel(T* y, T* sum, float* mean, float* rstd, const T* x,
                                   const float* bias, const T* residual, const float* gamma,
                                   const float* beta, dropout_plan plan, float scale, float eps,
                                   int rows, int c, bool columns_aligned) {
  constexpr int G = 32 * W;
  __shared__ float scratch[W];
  const int t = static_cast<int>(threadIdx.x) % G;
  const long long row = static_cast<long long>(blockIdx.x) * forward_rows_per_block(W) +
                        static_cast<long long>(threadIdx.x) / G;
  if (row >= rows)
    return; // a whole warp (W == 1); W > 1 has one row per block and never returns here
  const int vectors = c / vec;
  const long long first = row * c;

  // All loads first, then v once per element; vectors past the row stay 0.
  float xv[K][vec], rv[K][vec];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int q = k * G + t;
    if (q < vectors) {
      load_vector(xv[k], x + first + static_cast<long long>(q) * vec);
      load_vector(rv[k], residual + first + static_cast<long long>(q) * vec);
    }
  }
  float v[K][vec];
  float part = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int q = k * G + t;
    if (q < vectors) {
      float b[vec];
      bool keep[vec];
      load_columns(b, bias + q * vec, columns_aligned);
      keep_vector(keep, plan, static_cast<std::uint64_t>(first + static_cast<long long>(q) * vec));
#pragma unroll
      for (int e = 0; e < vec; ++e) {
        v[k][e] = common::residual_sum_element(xv[k][e], b[e], rv[k][e], keep[e], scale);
        part += v[k][e];
      }
    } else {
#pragma unroll
      for (int e = 0; e < vec; ++e)
        v[k][e] = 0.0f;
    }
  }
  common::welford w;
  w.count = static_cast<float>(c);
  w.mean = row_sum<W>(part, scratch) / w.count;
  part = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (k * G + t < vectors) {
#pragma unroll
      for (int e = 0; e < vec; ++e) {
        const float d = v[k][e] - w.mean;
        part = fmaf(d, d, part);
      }
    }
  w.m2 = row_sum<W>(part, scratch);
  const float s = common::welford_rstd(w, eps);

#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int q = k * G + t;
    if (q < vectors) {
      float g[vec], b[vec], out[vec];
      load_columns(g, gamma + q * vec, columns_aligned);
      load_columns(b, beta + q * vec, columns_aligned);
#pragma unroll
      for (int e = 0; e < vec; ++e)
        out[e] = common::layernorm_normalize(v[k][e], w.mean, s, g[e], b[e]);
      const long long at = first + static_cast<long long>(q) * vec;
      if (sum)
        store_vector(sum + at, v[k]);
      store_vector(y + at, out); // this thread read residual[at ..] above
    }
  }
  if (t == 0) {
    mean[row] = w.mean;
    rstd[row] = s;
  }
}

// bar.sync on barrier `id` (1..15; 0 is __syncthreads) among `threads` threads.
__device__ __forceinline__ void group_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

template <class T, int K, int W>
__global__ void __launch_bounds__(backward_block_threads(W))
    residual_layernorm_backward_rows_kernel(T* dresidual, T* dx, float* dgamma, float* dbeta,
                                            float* dbias, const T* dy, const T* sum,
                                            const float* mean, const float* rstd,
                                            const float* gamma, dropout_plan plan, float scale,
                                            int rows, int c, int rows_per_block,
                                            bool columns_aligned) {
  constexpr int G = 32 * W, groups = backward_groups(W), threads = groups * G;
  constexpr int R = backward_rows_per_step, slots = K * vec * G, warps = threads / 32;
  static_assert(W == 1 || groups <= 15, "named barriers 1..15");
  // Dynamic shared memory, 3 slots floats: first, per step, each warp's 2 R partial sums in
  // two halves used by alternate steps (row_scratch[((half warps + warp) R + r) 2 + i]);
  // after the rows, the block's column sums: dgamma, dbeta, dbias terms, `slots` floats
  // each, thread-major (slot (k vec + e) G + t holds column (k G + t) vec + e).
  extern __shared__ float shared[];
  static_assert(2 * warps * R * 2 <= 3 * slots, "row scratch fits");
  float* const row_scratch = shared;
  const int group = static_cast<int>(threadIdx.x) / G, t = static_cast<int>(threadIdx.x) % G;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int vectors = c / vec;
  const bool masked = dx || dbias;

  float acc_g[K][vec], acc_b[K][vec], acc_d[K][vec];
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int e = 0; e < vec; ++e)
      acc_g[k][e] = acc_b[k][e] = acc_d[k][e] = 0.0f;

  const long long block_first = static_cast<long long>(blockIdx.x) * rows_per_block;
  const long long block_end =
      block_first + rows_per_block < rows ? block_first + rows_per_block : rows;
  // Step i of a group takes its rows block_first + (i R + r) groups + group, r < R, those
  // below block_end. Every group takes the same number of steps (past the block's rows, a
  // step only joins its group's barrier), so that all pass the same barriers. The loads of
  // the next step's rows are made at the start of a step.
  const long long steps = (block_end - block_first + groups * R - 1) / (groups * R);
  auto row_of = [&](long long step, int r) {
    return block_first + (step * R + r) * groups + group;
  };
  auto load_row = [&](row_loads<K>& l, long long row) {
    const long long first = row * c;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int q = k * G + t;
      if (q < vectors) {
        l.dy[k] = load_raw(dy + first + static_cast<long long>(q) * vec);
        l.sum[k] = load_raw(sum + first + static_cast<long long>(q) * vec);
      }
    }
    l.mean = mean[row];
    l.rstd = rstd[row];
  };
  row_loads<K> loads[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (row_of(0, r) < block_end)
      load_row(loads[r], row_of(0, r));

  for (long long step = 0; step < steps; ++step) {
    float xhat[R][K][vec], dxhat[R][K][vec], part[R][2], m[R], s[R];
    bool valid[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      valid[r] = row_of(step, r) < block_end;
      m[r] = loads[r].mean;
      s[r] = loads[r].rstd;
      part[r][0] = part[r][1] = 0.0f;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int q = k * G + t;
        if (valid[r] && q < vectors) {
          float g[vec], sv[vec], gm[vec];
          unpack<T>(g, loads[r].dy[k]);
          unpack<T>(sv, loads[r].sum[k]);
          load_columns(gm, gamma + q * vec, columns_aligned);
#pragma unroll
          for (int e = 0; e < vec; ++e) {
            xhat[r][k][e] = (sv[e] - m[r]) * s[r];
            dxhat[r][k][e] = g[e] * gm[e];
            part[r][0] += dxhat[r][k][e];
            part[r][1] = fmaf(dxhat[r][k][e], xhat[r][k][e], part[r][1]);
            acc_g[k][e] = fmaf(g[e], xhat[r][k][e], acc_g[k][e]);
            acc_b[k][e] += g[e];
          }
        } else {
#pragma unroll
          for (int e = 0; e < vec; ++e)
            xhat[r][k][e] = dxhat[r][k][e] = 0.0f;
        }
      }
    }
    // The registers are free: load the next step's rows while this one is finished.
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (row_of(step + 1, r) < block_end)
        load_row(loads[r], row_of(step + 1, r));

#pragma unroll
    for (int r = 0; r < R; ++r) {
      part[r][0] = detail::warp_sum(part[r][0]);
      part[r][1] = detail::warp_sum(part[r][1]);
    }
    if constexpr (W > 1) {
      // A warp writes this half again two steps later, after the next step's barrier,
      // which every reader of this step reaches only after reading.
      float* const halves = row_scratch + static_cast<int>(step & 1) * warps * R * 2;
      if (threadIdx.x % 32 == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          halves[(warp * R + r) * 2] = part[r][0];
          halves[(warp * R + r) * 2 + 1] = part[r][1];
        }
      }
      group_barrier(1 + group, G);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        part[r][0] = part[r][1] = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) {
          part[r][0] += halves[((group * W + w) * R + r) * 2];
          part[r][1] += halves[((group * W + w) * R + r) * 2 + 1];
        }
      }
    }

#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (!valid[r])
        continue;
      const float m1 = part[r][0] / static_cast<float>(c);
      const float m2 = part[r][1] / static_cast<float>(c);
      const long long first = row_of(step, r) * c;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int q = k * G + t;
        if (q < vectors) {
          const long long at = first + static_cast<long long>(q) * vec;
          float d[vec];
#pragma unroll
          for (int e = 0; e < vec; ++e)
            d[e] = common::layernorm_input_grad(dxhat[r][k][e], xhat[r][k][e], m1, m2, s[r]);
          store_vector(dresidual + at, d); // this thread read dy[at ..] above
          if (masked) {
            bool keep[vec];
            keep_vector(keep, plan, static_cast<std::uint64_t>(at));
#pragma unroll
            for (int e = 0; e < vec; ++e) {
              d[e] = common::dropout_apply(d[e], keep[e], scale);
              acc_d[k][e] += d[e];
            }
            if (dx)
              store_vector(dx + at, d);
          }
        }
      }
    }
  }

  // The groups' column sums into shared memory in turn, then one atomic per column.
  if (!dgamma && !dbeta && !dbias)
    return;        // uniform over the block
  __syncthreads(); // every group is past its rows: the row scratch is free
  float* const cg = shared;
  float* const cb = shared + slots;
  float* const cd = shared + 2 * slots;
  for (int turn = 0; turn < groups; ++turn) {
    if (group == turn) {
#pragma unroll
      for (int k = 0; k < K; ++k)
#pragma unroll
        for (int e = 0; e < vec; ++e) {
          const int slot = (k * vec + e) * G + t;
          cg[slot] = turn == 0 ? acc_g[k][e] : cg[slot] + acc_g[k][e];
          cb[slot] = turn == 0 ? acc_b[k][e] : cb[slot] + acc_b[k][e];
          cd[slot] = turn == 0 ? acc_d[k][e] : cd[slot] + acc_d[k][e];
        }
    }
    __syncthreads();
  }
  for (int j = static_cast<int>(threadIdx.x); j < c; j += threads) {
    const int q = j / vec;
    const int slot = ((q / G) * vec + j % vec) * G + q % G;
    if (dgamma)
      atomicAdd(dgamma + j, cg[slot]);
    if (dbeta)
      atomicAdd(dbeta + j, cb[slot]);
    if (dbias)
      atomicAdd(dbias + j, cd[slot]);
  }
}

// ---- Other shapes ----

template <class T>
__global__ void residual_layernorm_kernel(T* y, T* sum, float* mean, float* rstd, const T* x,
                                          const float* bias, const T* residual, const float* gamma,
                                          const float* beta, float p, float scale,
                                          philox_stream rng, float eps, long long c) {
  __shared__ common::welford scratch[detail::warps_per_block];
  const long long row = blockIdx.x;
  const long long first = row * c;
  auto v_at = [&](long long j) {
    const bool keep = common::dropout_keep_element(rng, static_cast<std::uint64_t>(first + j), p);
    return common::residual_sum_element(detail::to_float(x[first + j]), bias[j],
                                        detail::to_float(residual[first + j]), keep, scale);
  };
  common::welford w;
  for (long long j = threadIdx.x; j < c; j += blockDim.x)
    w = common::welford_add(w, v_at(j));
  w = detail::block_welford(w, scratch);
  const float s = common::welford_rstd(w, eps);
  for (long long j = threadIdx.x; j < c; j += blockDim.x) {
    const float v = v_at(j); // reads residual[first + j] before y (which may alias it) is written
    if (sum)
      sum[first + j] = detail::from_float<T>(v);
    y[first + j] =
        detail::from_float<T>(common::layernorm_normalize(v, w.mean, s, gamma[j], beta[j]));
  }
  if (threadIdx.x == 0) {
    mean[row] = w.mean;
    rstd[row] = s;
  }
}

template <class T>
__global__ void residual_layernorm_backward_kernel(T* dresidual, T* dx, float* dgamma, float* dbeta,
                                                   float* dbias, const T* dy, const T* sum,
                                                   const float* mean, const float* rstd,
                                                   const float* gamma, float p, float scale,
                                                   philox_stream rng, long long rows, long long c,
                                                   long long rows_per_block, bool shared_sums) {
  __shared__ float scratch[detail::warps_per_block];
  // With shared_sums, the block's column sums (dgamma, dbeta, dbias parts, 3c floats) build up
  // in shared memory over its rows and reach the global sums with one atomic per column.
  // Thread t always owns columns t, t + blockDim.x, ...: no other thread touches them.
  extern __shared__ float column_sums[];
  float* const cg = column_sums;
  float* const cb = column_sums + c;
  float* const cd = column_sums + 2 * c;
  if (shared_sums) {
    for (long long j = threadIdx.x; j < 3 * c; j += blockDim.x)
      column_sums[j] = 0.0f;
    __syncthreads(); // zeroed by other threads than the columns' owners
  }
  const detail::layernorm_column_sums sums{dgamma, dbeta, cg, cb, shared_sums};
  const long long first_row = blockIdx.x * rows_per_block;
  const long long last_row = first_row + rows_per_block < rows ? first_row + rows_per_block : rows;
  for (long long row = first_row; row < last_row; ++row) {
    const long long first = row * c;
    const float m = mean[row], s = rstd[row];
    const detail::layernorm_row_means means = detail::layernorm_backward_row_means(
        sums, [&](long long j) { return detail::to_float(dy[first + j]); }, sum + first, m, s,
        gamma, c, scratch);
    // Each thread rewrites only the elements it read, so dresidual may alias dy.
    for (long long j = threadIdx.x; j < c; j += blockDim.x) {
      const float dsum = detail::layernorm_backward_dx(detail::to_float(dy[first + j]), sum + first,
                                                       gamma, j, m, s, means);
      dresidual[first + j] = detail::from_float<T>(dsum);
      if (dx || dbias) {
        const bool keep = common::dropout_keep_element(rng, static_cast<std::uint64_t>(first + j), p);
        const float d = common::dropout_apply(dsum, keep, scale);
        if (dx)
          dx[first + j] = detail::from_float<T>(d);
        if (shared_sums)
          cd[j] += d;
        else if (dbias)
          atomicAdd(dbias + j, d);
      }
    }
  }
  if (shared_sums)
    for (long long j = threadIdx.x; j < c; j += blockDim.x) {
      sums.flush(j);
      if (dbias)
        atomicAdd(dbias + j, cd[j]);
    }
}

// ---- Launch ----

// More than a stream's 2^32 Philox blocks (4 elements each), without forming rows c.
bool too_many_elements(std::int64_t rows, std::int64_t c) {
  return rows > 0 && c > (std::int64_t{1} << 34) / rows;
}

// Whether p (null allowed) is aligned to `bytes`.
bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// Rows in registers: W warps per row, K vectors of 8 per thread; warps == 0 where none fits.
struct rows_config {
  int warps = 0;
  int vectors = 0;
};

// The (W, K) a kernel is built for, smallest first; a row takes the first that holds it,
// which leaves the fewest slots idle among them. Measured on an H200 (bf16, p = 0.1, 8192
// and 65536 rows), K = 2 beat K = 4 and K = 1 at the same row width (c = 1024: 58% of copy
// bandwidth against 48% and 55%; c = 4096: 70% against 64% and 54%), and K = 3 at c = 768
// (55%) matched W = 3, K = 1. The backward keeps three column sums per element in
// registers and stays at K = 1.
template <int W, int K> struct split {};
template <class... S> struct split_list {};
using forward_splits = split_list<split<1, 1>, split<1, 2>, split<1, 3>, split<2, 2>, split<3, 2>,
                                  split<4, 2>, split<4, 3>, split<8, 2>>;
using backward_splits =
    split_list<split<1, 1>, split<2, 1>, split<3, 1>, split<4, 1>, split<8, 1>, split<16, 1>>;

template <int W, int K, class... Rest>
rows_config pick_rows_config(std::int64_t c, split_list<split<W, K>, Rest...>) {
  if (c / vec <= 32 * W * K)
    return {W, K};
  if constexpr (sizeof...(Rest) > 0)
    return pick_rows_config(c, split_list<Rest...>{});
  else
    return {};
}

// Calls fn(integral_constant W, integral_constant K) for cfg, one of the list's.
template <int W, int K, class... Rest, class Fn>
cudaError_t with_config(rows_config cfg, split_list<split<W, K>, Rest...>, Fn&& fn) {
  if (cfg.warps == W && cfg.vectors == K)
    return fn(std::integral_constant<int, W>{}, std::integral_constant<int, K>{});
  if constexpr (sizeof...(Rest) > 0)
    return with_config(cfg, split_list<Rest...>{}, fn);
  else
    return cudaErrorInvalidValue;
}

// The row pointers allow 8-element vectors and a config fits c (warps == 0 otherwise).
rows_config forward_rows_config(const void* y, const void* sum, const void* x, const void* residual,
                                elem type, std::int64_t c) {
  const auto bytes = static_cast<std::size_t>(vec * elem_size(type));
  if (c % vec != 0 || !aligned(y, bytes) || !aligned(sum, bytes) || !aligned(x, bytes) ||
      !aligned(residual, bytes))
    return {};
  return pick_rows_config(c, forward_splits{});
}

rows_config backward_rows_config(const void* dresidual, const void* dx, const void* dy,
                                 const void* sum, elem type, std::int64_t c) {
  const auto bytes = static_cast<std::size_t>(vec * elem_size(type));
  if (c % vec != 0 || c > backward_max_columns || !aligned(dresidual, bytes) ||
      !aligned(dx, bytes) || !aligned(dy, bytes) || !aligned(sum, bytes))
    return {};
  return pick_rows_config(c, backward_splits{});
}

template <class T>
cudaError_t launch_forward_rows(rows_config cfg, T* y, T* sum, float* mean, float* rstd, const T* x,
                                const float* bias, const T* residual, const float* gamma,
                                const float* beta, float p, const philox_stream& rng, float eps,
                                std::int64_t rows, std::int64_t c, cudaStream_t stream) {
  const bool columns_aligned = aligned(bias, 16) && aligned(gamma, 16) && aligned(beta, 16);
  auto launch = [&](auto warps, auto vectors) {
    constexpr int W = decltype(warps)::value, K = decltype(vectors)::value;
    constexpr int per_block = forward_rows_per_block(W);
    const auto blocks = static_cast<unsigned>((rows + per_block - 1) / per_block);
    residual_layernorm_rows_kernel<T, K, W><<<blocks, 32 * W * per_block, 0, stream>>>(
        y, sum, mean, rstd, x, bias, residual, gamma, beta, make_dropout_plan(rng, p),
        1.0f / (1.0f - p), eps, static_cast<int>(rows), static_cast<int>(c), columns_aligned);
    return cudaGetLastError();
  };
  return with_config(cfg, forward_splits{}, launch);
}

template <class T>
cudaError_t launch_backward_rows(rows_config cfg, T* dresidual, T* dx, float* dgamma, float* dbeta,
                                 float* dbias, const T* dy, const T* sum, const float* mean,
                                 const float* rstd, const float* gamma, float p,
                                 const philox_stream& rng, std::int64_t rows, std::int64_t c,
                                 cudaStream_t stream) {
  const bool columns_aligned = aligned(gamma, 16);
  auto launch = [&](auto warps, auto vectors) -> cudaError_t {
    constexpr int W = decltype(warps)::value, K = decltype(vectors)::value;
    constexpr int threads = backward_block_threads(W);
    constexpr std::int64_t unit = backward_groups(W) * backward_rows_per_step; // rows a step
    const auto kernel = residual_layernorm_backward_rows_kernel<T, K, W>;
    const auto shared = static_cast<std::size_t>(3 * K * vec * 32 * W) * sizeof(float);
    // One wave of resident blocks, each a run of rows that is a multiple of `unit`.
    int device = 0, sms = 0, per_sm = 0;
    if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
      return e;
    if (const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        e != cudaSuccess)
      return e;
    if (const cudaError_t e =
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared);
        e != cudaSuccess)
      return e;
    const std::int64_t resident =
        static_cast<std::int64_t>(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
    const std::int64_t units = (rows + unit - 1) / unit; // blocks at one step each
    const std::int64_t wave = units < resident ? units : resident;
    std::int64_t per_block = unit * ((units + wave - 1) / wave);
    if (per_block > rows)
      per_block = rows; // one block (the int below cannot overflow)
    const auto blocks = static_cast<unsigned>((rows + per_block - 1) / per_block);
    kernel<<<blocks, threads, shared, stream>>>(
        dresidual, dx, dgamma, dbeta, dbias, dy, sum, mean, rstd, gamma, make_dropout_plan(rng, p),
        1.0f / (1.0f - p), static_cast<int>(rows), static_cast<int>(c), static_cast<int>(per_block),
        columns_aligned);
    return cudaGetLastError();
  };
  return with_config(cfg, backward_splits{}, launch);
}

} // namespace

cudaError_t residual_layernorm_forward(void* y, void* sum, float* mean, float* rstd, const void* x,
                                       const float* bias, const void* residual, const float* gamma,
                                       const float* beta, float p, const philox_stream& rng,
                                       float eps, elem type, std::int64_t rows, std::int64_t c,
                                       cudaStream_t stream) {
  if (rows < 0 || rows > 2147483647LL || c <= 0 || !(p >= 0.0f && p < 1.0f) || !y || !mean ||
      !rstd || !x || !bias || !residual || !gamma || !beta)
    return cudaErrorInvalidValue;
  if (too_many_elements(rows, c))
    return cudaErrorInvalidValue; // Philox blocks of one stream
  if (rows == 0)
    return cudaSuccess;
  const rows_config cfg = forward_rows_config(y, sum, x, residual, type, c);
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    if (cfg.warps != 0)
      return launch_forward_rows<T>(cfg, static_cast<T*>(y), static_cast<T*>(sum), mean, rstd,
                                    static_cast<const T*>(x), bias, static_cast<const T*>(residual),
                                    gamma, beta, p, rng, eps, rows, c, stream);
    residual_layernorm_kernel<T><<<static_cast<unsigned>(rows), detail::block_threads, 0, stream>>>(
        static_cast<T*>(y), static_cast<T*>(sum), mean, rstd, static_cast<const T*>(x), bias,
        static_cast<const T*>(residual), gamma, beta, p, 1.0f / (1.0f - p), rng, eps, c);
    return cudaGetLastError();
  });
}

cudaError_t residual_layernorm_backward(void* dresidual, void* dx, float* dgamma, float* dbeta,
                                        float* dbias, const void* dy, const void* sum,
                                        const float* mean, const float* rstd, const float* gamma,
                                        float p, const philox_stream& rng, elem type,
                                        std::int64_t rows, std::int64_t c, cudaStream_t stream) {
  if (rows < 0 || rows > 2147483647LL || c <= 0 || !(p >= 0.0f && p < 1.0f) || !dresidual || !dy ||
      !sum || !mean || !rstd || !gamma)
    return cudaErrorInvalidValue;
  if (too_many_elements(rows, c) || (dx && (dx == dy || dx == dresidual)))
    return cudaErrorInvalidValue;
  if (rows == 0)
    return cudaSuccess;
  const rows_config cfg = backward_rows_config(dresidual, dx, dy, sum, type, c);
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    if (cfg.warps != 0)
      return launch_backward_rows<T>(cfg, static_cast<T*>(dresidual), static_cast<T*>(dx), dgamma,
                                     dbeta, dbias, static_cast<const T*>(dy),
                                     static_cast<const T*>(sum), mean, rstd, gamma, p, rng, rows, c,
                                     stream);
    // Blocks of up to 32 rows keep their column sums in shared memory when 3c floats fit
    // beside the kernel's static scratch in 48 KB (c <= 4093), cutting the global atomics
    // 32-fold; wider rows take a row per block.
    const bool shared_sums = detail::column_sums_fit(3, c);
    const std::int64_t per_block = shared_sums ? 32 : 1;
    const std::int64_t blocks = (rows + per_block - 1) / per_block;
    residual_layernorm_backward_kernel<T><<<static_cast<unsigned>(blocks), detail::block_threads,
                                            shared_sums ? static_cast<std::size_t>(3 * c * 4) : 0,
                                            stream>>>(
        static_cast<T*>(dresidual), static_cast<T*>(dx), dgamma, dbeta, dbias,
        static_cast<const T*>(dy), static_cast<const T*>(sum), mean, rstd, gamma, p,
        1.0f / (1.0f - p), rng, rows, c, per_block, shared_sums);
    return cudaGetLastError();
  });
}

} // namespace dsa::cuda
