// Fused bias + dropout + residual + LayerNorm forward: a block per row. The first pass
// forms v and its Welford statistics; the second forms v again (the same arithmetic, so
// the same value) rather than keeping a row in shared memory of unknown size.
// Each element draws its own Philox block (four times the RNG work of the dropout kernel;
// cheap next to the row's loads, to be measured on a GPU).
// The backward takes up to 32 rows per block: per row, the first pass sums the row's dxhat
// and dxhat xhat, the second forms dsum, stores it, applies the regenerated mask and stores
// dx. The column sums build up in shared memory over the block's rows and reach the global
// sums through one f32 atomic per column and block (a row per block took one per element,
// which contended on the c addresses); the order of those atomics varies run to run. A
// deterministic column pass would need dy after dresidual may have overwritten it, and the
// f32 dx, which lives only in this kernel.
#include "kernels/cuda/residual_layernorm.hpp"

#include "kernels/common/residual_layernorm_math.hpp"
#include "kernels/cuda/device_math.cuh"

namespace dsa::cuda {
namespace {

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
  const long long first_row = blockIdx.x * rows_per_block;
  const long long last_row = first_row + rows_per_block < rows ? first_row + rows_per_block : rows;
  for (long long row = first_row; row < last_row; ++row) {
    const long long first = row * c;
    const float m = mean[row], s = rstd[row];
    float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
    for (long long j = threadIdx.x; j < c; j += blockDim.x) {
      const float g = detail::to_float(dy[first + j]);
      const float xhat = (detail::to_float(sum[first + j]) - m) * s;
      const float dxhat = g * gamma[j];
      sum_dxhat += dxhat;
      sum_dxhat_xhat = fmaf(dxhat, xhat, sum_dxhat_xhat);
      if (shared_sums) {
        cg[j] += g * xhat;
        cb[j] += g;
      } else {
        if (dgamma)
          atomicAdd(dgamma + j, g * xhat);
        if (dbeta)
          atomicAdd(dbeta + j, g);
      }
    }
    // block_sum synchronizes on both sides, so the next row's use of scratch is safe.
    const float m1 = detail::block_sum(sum_dxhat, scratch) / static_cast<float>(c);
    const float m2 = detail::block_sum(sum_dxhat_xhat, scratch) / static_cast<float>(c);
    // Each thread rewrites only the elements it read, so dresidual may alias dy.
    for (long long j = threadIdx.x; j < c; j += blockDim.x) {
      const float g = detail::to_float(dy[first + j]);
      const float xhat = (detail::to_float(sum[first + j]) - m) * s;
      const float dsum = common::layernorm_input_grad(g * gamma[j], xhat, m1, m2, s);
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
      if (dgamma)
        atomicAdd(dgamma + j, cg[j]);
      if (dbeta)
        atomicAdd(dbeta + j, cb[j]);
      if (dbias)
        atomicAdd(dbias + j, cd[j]);
    }
}

// More than a stream's 2^32 Philox blocks (4 elements each), without forming rows c.
bool too_many_elements(std::int64_t rows, std::int64_t c) {
  return rows > 0 && c > (std::int64_t{1} << 34) / rows;
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
  if ((rows * c + 3) / 4 > (std::int64_t{1} << 32))
    return cudaErrorInvalidValue; // Philox blocks of one stream
  if (rows == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
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
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    // Blocks of up to 32 rows keep their column sums in shared memory when 3c floats fit
    // (c <= 4096), cutting the global atomics 32-fold; wider rows take a row per block.
    const bool shared_sums = 3 * c * 4 <= 48 * 1024;
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
