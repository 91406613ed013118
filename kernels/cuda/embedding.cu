// BERT embedding kernels. Forward: a block per row; the first pass forms e from the three
// table rows and its Welford statistics, the second forms e again (the same arithmetic, so
// the same value) to store the stash, normalize and drop out, rather than keeping a row of
// unknown width in shared memory.
// Backward: blocks of up to 32 rows; per row, the first pass sums dxhat and dxhat xhat, the
// second forms the LayerNorm input gradient and scatters it by atomics. The dropout mask is
// drawn again in both passes (a Philox block per element, as residual_layernorm.cu).
// dgamma, dbeta and the token-type gradient (a few rows, hit by every row of the batch)
// build up in shared memory over the block's rows and reach global memory with one atomic
// per column and block (per run of equal token types); rows too wide for that take a block
// each and an atomic per element. The position and word gradients always take an atomic
// per element: their rows spread over the batch.
#include "kernels/cuda/embedding.hpp"

#include "kernels/common/dropout_math.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/layernorm_backward.cuh"

namespace dsa::cuda {
namespace {

template <class T>
__global__ void
embedding_forward_kernel(T* out, T* sum, float* mean, float* rstd, const std::int32_t* ids,
                         const std::int32_t* token_types, const T* word, const T* position,
                         const T* token_type, const float* gamma, const float* beta, float eps,
                         float p, float scale, philox_stream rng, long long seq, long long c) {
  __shared__ common::welford scratch[detail::warps_per_block];
  const long long row = blockIdx.x;
  const long long first = row * c;
  const T* const wr = word + static_cast<long long>(ids[row]) * c;
  const T* const pr = position + (row % seq) * c;
  const T* const tr = token_type + static_cast<long long>(token_types ? token_types[row] : 0) * c;
  // models/bert/embeddings.cpp adds the position and token-type rows first.
  auto e_at = [&](long long j) {
    return detail::to_float(wr[j]) + (detail::to_float(pr[j]) + detail::to_float(tr[j]));
  };
  common::welford w;
  for (long long j = threadIdx.x; j < c; j += blockDim.x)
    w = common::welford_add(w, e_at(j));
  w = detail::block_welford(w, scratch);
  const float s = common::welford_rstd(w, eps);
  for (long long j = threadIdx.x; j < c; j += blockDim.x) {
    const float e = e_at(j);
    if (sum)
      sum[first + j] = detail::from_float<T>(e);
    const float y = common::layernorm_normalize(e, w.mean, s, gamma[j], beta[j]);
    // p == 0 keeps everything (every uniform is >= 0): skip the RNG.
    const bool keep =
        p == 0.0f || common::dropout_keep_element(rng, static_cast<std::uint64_t>(first + j), p);
    out[first + j] = detail::from_float<T>(common::dropout_apply(y, keep, scale));
  }
  if (threadIdx.x == 0) {
    mean[row] = w.mean;
    rstd[row] = s;
  }
}

template <class T>
__global__ void embedding_backward_kernel(float* dword, float* dposition, float* dtoken_type,
                                          float* dgamma, float* dbeta, const T* dout, const T* sum,
                                          const float* mean, const float* rstd, const float* gamma,
                                          const std::int32_t* ids, const std::int32_t* token_types,
                                          std::int32_t pad_id, float p, float scale,
                                          philox_stream rng, long long rows, long long seq,
                                          long long c, long long rows_per_block, bool shared_sums) {
  __shared__ float scratch[detail::warps_per_block];
  // With shared_sums: dgamma, dbeta and the current token type's gradient row (3c floats).
  // Thread t owns columns t, t + blockDim.x, ... of all three and is the only thread that
  // touches them, so they need no barrier.
  extern __shared__ float column_sums[];
  float* const cg = column_sums;
  float* const cb = column_sums + c;
  float* const ct = column_sums + 2 * c;
  if (shared_sums)
    for (long long j = threadIdx.x; j < c; j += blockDim.x)
      cg[j] = cb[j] = ct[j] = 0.0f;
  const detail::layernorm_column_sums sums{dgamma, dbeta, cg, cb, shared_sums};
  std::int32_t current_type = -1; // the token type ct holds; the same in every thread
  const long long first_row = blockIdx.x * rows_per_block;
  const long long last_row = first_row + rows_per_block < rows ? first_row + rows_per_block : rows;
  for (long long row = first_row; row < last_row; ++row) {
    const long long first = row * c;
    const float m = mean[row], s = rstd[row];
    const std::int32_t id = ids[row];
    const std::int32_t tt = token_types ? token_types[row] : 0;
    if (shared_sums && tt != current_type) {
      if (current_type >= 0)
        for (long long j = threadIdx.x; j < c; j += blockDim.x) {
          atomicAdd(dtoken_type + current_type * c + j, ct[j]);
          ct[j] = 0.0f;
        }
      current_type = tt;
    }
    auto d_at = [&](long long j) { // dropout backward of dout
      const bool keep =
          p == 0.0f || common::dropout_keep_element(rng, static_cast<std::uint64_t>(first + j), p);
      return common::dropout_apply(detail::to_float(dout[first + j]), keep, scale);
    };
    const detail::layernorm_row_means means =
        detail::layernorm_backward_row_means(sums, d_at, sum + first, m, s, gamma, c, scratch);
    float* const prow = dposition + (row % seq) * c;
    float* const trow = dtoken_type + static_cast<long long>(tt) * c;
    float* const wrow = id == pad_id ? nullptr : dword + static_cast<long long>(id) * c;
    for (long long j = threadIdx.x; j < c; j += blockDim.x) {
      const float de = detail::layernorm_backward_dx(d_at(j), sum + first, gamma, j, m, s, means);
      atomicAdd(prow + j, de);
      if (shared_sums)
        ct[j] += de;
      else
        atomicAdd(trow + j, de);
      if (wrow)
        atomicAdd(wrow + j, de);
    }
  }
  if (shared_sums)
    for (long long j = threadIdx.x; j < c; j += blockDim.x) {
      sums.flush(j);
      if (current_type >= 0)
        atomicAdd(dtoken_type + current_type * c + j, ct[j]);
    }
}

// Sizes both launchers refuse: rows past a grid, rows not whole sequences, more elements
// than a stream's 2^32 Philox blocks of four (tested without forming rows hidden), and a
// rate outside [0, 1) (NaN included).
bool bad_sizes(float p, std::int64_t rows, std::int64_t seq, std::int64_t hidden) {
  return rows < 0 || rows > 2147483647LL || seq <= 0 || hidden <= 0 || rows % seq != 0 ||
         (rows > 0 && hidden > (std::int64_t{1} << 34) / rows) || !(p >= 0.0f && p < 1.0f);
}

} // namespace

cudaError_t embedding_forward(void* out, void* sum, float* mean, float* rstd,
                              const std::int32_t* ids, const std::int32_t* token_types,
                              const void* word, const void* position, const void* token_type,
                              const float* gamma, const float* beta, float eps, float p,
                              const philox_stream& rng, elem type, std::int64_t rows,
                              std::int64_t seq, std::int64_t hidden, cudaStream_t stream) {
  if (bad_sizes(p, rows, seq, hidden) || !out || !mean || !rstd || !ids || !word || !position ||
      !token_type || !gamma || !beta)
    return cudaErrorInvalidValue;
  if (rows == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    embedding_forward_kernel<T><<<static_cast<unsigned>(rows), detail::block_threads, 0, stream>>>(
        static_cast<T*>(out), static_cast<T*>(sum), mean, rstd, ids, token_types,
        static_cast<const T*>(word), static_cast<const T*>(position),
        static_cast<const T*>(token_type), gamma, beta, eps, p, 1.0f / (1.0f - p), rng, seq,
        hidden);
    return cudaGetLastError();
  });
}

cudaError_t embedding_backward(float* dword, float* dposition, float* dtoken_type, float* dgamma,
                               float* dbeta, const void* dout, const void* sum, const float* mean,
                               const float* rstd, const float* gamma, const std::int32_t* ids,
                               const std::int32_t* token_types, std::int32_t pad_id, float p,
                               const philox_stream& rng, elem type, std::int64_t rows,
                               std::int64_t seq, std::int64_t hidden, cudaStream_t stream) {
  if (bad_sizes(p, rows, seq, hidden) || !dword || !dposition || !dtoken_type || !dout || !sum ||
      !mean || !rstd || !gamma || !ids)
    return cudaErrorInvalidValue;
  if (rows == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    // Blocks of up to 32 rows keep their column sums in shared memory when they fit; wider
    // rows take a row per block and an atomic per element.
    const bool shared_sums = detail::column_sums_fit(3, hidden); // hidden <= 4093
    const std::int64_t per_block = shared_sums ? 32 : 1;
    const std::int64_t blocks = (rows + per_block - 1) / per_block;
    embedding_backward_kernel<T>
        <<<static_cast<unsigned>(blocks), detail::block_threads,
           shared_sums ? static_cast<std::size_t>(3 * hidden * 4) : 0, stream>>>(
            dword, dposition, dtoken_type, dgamma, dbeta, static_cast<const T*>(dout),
            static_cast<const T*>(sum), mean, rstd, gamma, ids, token_types, pad_id, p,
            1.0f / (1.0f - p), rng, rows, seq, hidden, per_block, shared_sums);
    return cudaGetLastError();
  });
}

} // namespace dsa::cuda
