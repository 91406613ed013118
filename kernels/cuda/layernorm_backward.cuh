// LayerNorm backward of one row by a whole block of detail::block_threads threads, each
// striding over the row: the device code of the backward kernels built that way
// (layernorm.cu, residual_layernorm.cu's other shapes, embedding.cu), so that they do the
// same arithmetic in the same order. Included by .cu files only.
#pragma once

#include "kernels/cuda/device_math.cuh"

#include <cstdint>

namespace dsa::cuda::detail {

// Where a row's dgamma (dy xhat) and dbeta (dy) terms go. With `block` set they build up
// in the block sums (shared memory, c floats each, thread t the only one to touch columns
// t, t + blockDim.x, ...) over the block's rows, and reach dgamma and dbeta through flush,
// an atomic per column; without, each element takes an atomic. dgamma and dbeta may be
// null: not wanted.
struct layernorm_column_sums {
  float* dgamma = nullptr;
  float* dbeta = nullptr;
  float* block_dgamma = nullptr;
  float* block_dbeta = nullptr;
  bool block = false;

  __device__ __forceinline__ void add(long long j, float dy, float xhat) const {
    if (block) {
      block_dgamma[j] += dy * xhat;
      block_dbeta[j] += dy;
    } else {
      if (dgamma)
        atomicAdd(dgamma + j, dy * xhat);
      if (dbeta)
        atomicAdd(dbeta + j, dy);
    }
  }

  // The block sums of column j into dgamma and dbeta (block sums only).
  __device__ __forceinline__ void flush(long long j) const {
    if (dgamma)
      atomicAdd(dgamma + j, block_dgamma[j]);
    if (dbeta)
      atomicAdd(dbeta + j, block_dbeta[j]);
  }
};

// The same terms straight to dgamma and dbeta, an atomic per element (either may be null:
// not wanted, as in the deterministic mode, which sums them apart).
struct layernorm_atomic_sums {
  float* dgamma = nullptr;
  float* dbeta = nullptr;

  __device__ __forceinline__ void add(long long j, float dy, float xhat) const {
    if (dgamma)
      atomicAdd(dgamma + j, dy * xhat);
    if (dbeta)
      atomicAdd(dbeta + j, dy);
  }
};

// Row means of dxhat = dy gamma and of dxhat xhat.
struct layernorm_row_means {
  float dxhat = 0.0f;
  float dxhat_xhat = 0.0f;
};

// First pass over a row: adds its dgamma and dbeta terms to `sums` (a layernorm_column_sums
// or layernorm_atomic_sums) and returns its means.
// grad(j) gives dy_j as a float; x: the row's LayerNorm input (c); gamma: (c); scratch:
// warps_per_block floats (block_sum synchronizes on both sides, so the next row may reuse
// it). Every thread of the block calls it.
template <class T, class Sums, class Grad>
__device__ __forceinline__ layernorm_row_means
layernorm_backward_row_means(const Sums& sums, Grad&& grad, const T* x, float mean, float rstd,
                             const float* gamma, long long c, float* scratch) {
  float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
  for (long long j = threadIdx.x; j < c; j += blockDim.x) {
    const float g = grad(j);
    const float xhat = (to_float(x[j]) - mean) * rstd;
    const float dxhat = g * gamma[j];
    sum_dxhat += dxhat;
    sum_dxhat_xhat = fmaf(dxhat, xhat, sum_dxhat_xhat);
    sums.add(j, g, xhat);
  }
  layernorm_row_means means;
  means.dxhat = block_sum(sum_dxhat, scratch) / static_cast<float>(c);
  means.dxhat_xhat = block_sum(sum_dxhat_xhat, scratch) / static_cast<float>(c);
  return means;
}

// Second pass, per element: the input gradient dx_j from dy_j, the row's LayerNorm input x
// (c) and gamma (c), its statistics and its means.
template <class T>
__device__ __forceinline__ float layernorm_backward_dx(float dy, const T* x, const float* gamma,
                                                       long long j, float mean, float rstd,
                                                       layernorm_row_means means) {
  const float xhat = (to_float(x[j]) - mean) * rstd;
  return common::layernorm_input_grad(dy * gamma[j], xhat, means.dxhat, means.dxhat_xhat, rstd);
}

// Whether `count` column sums of c floats fit beside block_sum's scratch in the 48 KiB of
// shared memory a block gets without opting in (static and dynamic together).
inline bool column_sums_fit(int count, std::int64_t c) {
  return count * c * 4 + warps_per_block * 4 <= 48 * 1024;
}

} // namespace dsa::cuda::detail
