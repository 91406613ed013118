// The post-LN BERT sublayer end, shared by the CPU twin and the CUDA kernel:
// y = LayerNorm(dropout(x + bias) + residual), the dropout mask from Philox element
// r c + j of the stream (as cpu::dropout_forward over the whole (rows, c) buffer).
#pragma once

#include "kernels/common/dropout_math.hpp"
#include "kernels/common/layernorm_math.hpp"

#include <stdint.h>

namespace dsa::common {

// v = dropout(x + bias) + residual, with one explicit fma so that host and device
// compilers cannot contract it differently.
DSA_HD float residual_sum_element(float x, float bias, float residual, bool keep, float scale) {
  return keep ? fmaf(x + bias, scale, residual) : residual;
}

// One row, serially: sum = v (the LayerNorm input, saved for backward), y = LN(v),
// *mean, *rstd. x, residual, y, sum: (c); bias, gamma, beta: (c); `first` is the flat
// index r c of the row's first element in the dropout stream; scale = 1 / (1 - p).
DSA_HD void residual_layernorm_row_forward(float* y, float* sum, float* mean, float* rstd,
                                           const float* x, const float* bias, const float* residual,
                                           const float* gamma, const float* beta, float p,
                                           const philox_stream& rng, uint64_t first, float eps,
                                           int64_t c) {
  const float scale = 1.0f / (1.0f - p);
  for (int64_t j = 0; j < c; ++j)
    sum[j] =
        residual_sum_element(x[j], bias[j], residual[j],
                             dropout_keep_element(rng, first + static_cast<uint64_t>(j), p), scale);
  layernorm_row_forward(y, mean, rstd, sum, gamma, beta, eps, c);
}

} // namespace dsa::common
