// LayerNorm arithmetic shared by CPU tests and CUDA kernels: Welford statistics that
// merge across threads (a CUDA block merges its threads' partials with the same
// function), the per-element normalize and input-gradient formulas, and serial row
// functions built from them (the CPU twin the CUDA kernels are compared against).
#pragma once

#include "kernels/common/host_device.hpp"

#include <math.h>
#include <stdint.h>

namespace dsa::common {

// Running count, mean and sum of squared deviations (Welford / Chan et al.).
struct welford {
  float count = 0.0f;
  float mean = 0.0f;
  float m2 = 0.0f;
};

DSA_HD welford welford_add(welford w, float x) {
  w.count += 1.0f;
  const float delta = x - w.mean;
  w.mean += delta / w.count;
  w.m2 = fmaf(delta, x - w.mean, w.m2);
  return w;
}

// Combines two partial statistics (either may be empty).
DSA_HD welford welford_merge(welford a, welford b) {
  if (b.count == 0.0f)
    return a;
  if (a.count == 0.0f)
    return b;
  welford r;
  r.count = a.count + b.count;
  const float delta = b.mean - a.mean;
  const float wb = b.count / r.count;
  r.mean = fmaf(delta, wb, a.mean);
  r.m2 = a.m2 + b.m2 + delta * delta * a.count * wb;
  return r;
}

// rstd = 1 / sqrt(biased variance + eps).
DSA_HD float welford_rstd(welford w, float eps) {
  return 1.0f / sqrtf(w.m2 / w.count + eps);
}

// y = (x - mean) * rstd * gamma + beta.
DSA_HD float layernorm_normalize(float x, float mean, float rstd, float gamma, float beta) {
  return fmaf((x - mean) * rstd, gamma, beta);
}

// dx from dxhat = dy * gamma, xhat and the row means of dxhat and dxhat * xhat.
DSA_HD float layernorm_input_grad(float dxhat, float xhat, float mean_dxhat, float mean_dxhat_xhat,
                                  float rstd) {
  return rstd * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
}

// One row, serially: y, x: (c); gamma, beta: (c); writes y, *mean, *rstd.
DSA_HD void layernorm_row_forward(float* y, float* mean, float* rstd, const float* x,
                                  const float* gamma, const float* beta, float eps, int64_t c) {
  welford w;
  for (int64_t j = 0; j < c; ++j)
    w = welford_add(w, x[j]);
  const float s = welford_rstd(w, eps);
  for (int64_t j = 0; j < c; ++j)
    y[j] = layernorm_normalize(x[j], w.mean, s, gamma[j], beta[j]);
  *mean = w.mean;
  *rstd = s;
}

// One row, serially: dx = (overwrite), dgamma += dy * xhat, dbeta += dy. dx may not alias dy.
DSA_HD void layernorm_row_backward(float* dx, float* dgamma, float* dbeta, const float* dy,
                                   const float* x, float mean, float rstd, const float* gamma,
                                   int64_t c) {
  float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
  for (int64_t j = 0; j < c; ++j) {
    const float xhat = (x[j] - mean) * rstd;
    const float dxhat = dy[j] * gamma[j];
    sum_dxhat += dxhat;
    sum_dxhat_xhat = fmaf(dxhat, xhat, sum_dxhat_xhat);
    dgamma[j] = fmaf(dy[j], xhat, dgamma[j]);
    dbeta[j] += dy[j];
  }
  const float m1 = sum_dxhat / static_cast<float>(c), m2 = sum_dxhat_xhat / static_cast<float>(c);
  for (int64_t j = 0; j < c; ++j) {
    const float xhat = (x[j] - mean) * rstd;
    dx[j] = layernorm_input_grad(dy[j] * gamma[j], xhat, m1, m2, rstd);
  }
}

} // namespace dsa::common
