// LayerNorm on CPU: OpenMP over rows, SIMD inner loops, fixed-order reductions of
// dgamma/dbeta so gradients are bit-identical run to run whatever the thread count.
#include "kernels/cpu/layernorm.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace dsa::cpu {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr std::int64_t parallel_threshold = 1 << 15;
// dgamma/dbeta partials: rows are cut into at most this many fixed chunks (independent
// of the thread count), each chunk sums its rows in order, chunks are added in order.
constexpr std::int64_t max_chunks = 32;

void check_sizes(std::int64_t rows, std::int64_t c) {
  DSA_CHECK(rows >= 0 && c > 0, "layernorm: bad sizes rows={} c={}", rows, c);
}

// One row of backward given xhat(j). Accumulates dgamma/dbeta partials into pg/pb and
// overwrites dx (which may alias dy: each element is read before it is written).
// dxhat = dy * gamma is stored in dx between the passes so that the second pass
// subtracts the mean of exactly the values it sums (an FMA-contracted recompute would
// not cancel, and rstd can be 1e6 on a near-constant row).
template <class Xhat>
void backward_row(float* dx, float* pg, float* pb, const float* dy, const float* gamma, float rstd,
                  std::int64_t c, Xhat xhat) {
  float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
#pragma omp simd reduction(+ : sum_dxhat, sum_dxhat_xhat)
  for (std::int64_t j = 0; j < c; ++j) {
    const float xh = xhat(j), g = dy[j];
    const float dxh = g * gamma[j];
    sum_dxhat += dxh;
    sum_dxhat_xhat += dxh * xh;
    pg[j] += g * xh;
    pb[j] += g;
    dx[j] = dxh;
  }
  const float m1 = sum_dxhat / static_cast<float>(c);
  const float m2 = sum_dxhat_xhat / static_cast<float>(c);
#pragma omp simd
  for (std::int64_t j = 0; j < c; ++j)
    dx[j] = rstd * (dx[j] - m1 - xhat(j) * m2);
}

// Runs backward_row over all rows with chunked partials, then adds them to dgamma/dbeta.
template <class RowFn>
void backward_chunked(float* dgamma, float* dbeta, std::int64_t rows, std::int64_t c,
                      RowFn row_fn) {
  if (rows == 0)
    return;
  const std::int64_t chunks = std::min(rows, max_chunks);
  std::vector<float> partial(static_cast<std::size_t>(2 * chunks * c), 0.0f);
#pragma omp parallel for schedule(static) if (rows * c >= parallel_threshold)
  for (std::int64_t k = 0; k < chunks; ++k) {
    float* pg = partial.data() + 2 * k * c;
    float* pb = pg + c;
    const std::int64_t begin = k * rows / chunks, end = (k + 1) * rows / chunks;
    for (std::int64_t r = begin; r < end; ++r)
      row_fn(r, pg, pb);
  }
  for (std::int64_t k = 0; k < chunks; ++k) {
    const float* pg = partial.data() + 2 * k * c;
    const float* pb = pg + c;
    if (dgamma) {
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j)
        dgamma[j] += pg[j];
    }
    if (dbeta) {
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j)
        dbeta[j] += pb[j];
    }
  }
}

} // namespace

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* gamma,
                       const float* beta, float eps, std::int64_t rows, std::int64_t c) {
  check_sizes(rows, c);
#pragma omp parallel for schedule(static) if (rows * c >= parallel_threshold)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * c;
    float* yr = y + r * c;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t j = 0; j < c; ++j)
      sum += xr[j];
    const float m = sum / static_cast<float>(c);
    // Two passes: the variance of centred values does not cancel catastrophically.
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (std::int64_t j = 0; j < c; ++j) {
      float d = xr[j] - m;
      sq += d * d;
    }
    const float s = 1.0f / std::sqrt(sq / static_cast<float>(c) + eps);
#pragma omp simd
    for (std::int64_t j = 0; j < c; ++j)
      yr[j] = (xr[j] - m) * s * gamma[j] + beta[j];
    if (mean)
      mean[r] = m;
    if (rstd)
      rstd[r] = s;
  }
}

void layernorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                        const float* mean, const float* rstd, const float* gamma, std::int64_t rows,
                        std::int64_t c) {
  check_sizes(rows, c);
  backward_chunked(dgamma, dbeta, rows, c, [&](std::int64_t r, float* pg, float* pb) {
    const float* xr = x + r * c;
    const float m = mean[r], s = rstd[r];
    backward_row(dx + r * c, pg, pb, dy + r * c, gamma, s, c,
                 [xr, m, s](std::int64_t j) { return (xr[j] - m) * s; });
  });
}

void layernorm_backward_from_output(float* dx, float* dgamma, float* dbeta, const float* dy,
                                    const float* y, const float* rstd, const float* gamma,
                                    const float* beta, std::int64_t rows, std::int64_t c) {
  check_sizes(rows, c);
  std::vector<float> inv_gamma(static_cast<std::size_t>(c));
  for (std::int64_t j = 0; j < c; ++j) {
    DSA_CHECK(gamma[j] != 0.0f, "layernorm_backward_from_output: gamma[{}] is zero", j);
    inv_gamma[static_cast<std::size_t>(j)] = 1.0f / gamma[j];
  }
  const float* ig = inv_gamma.data();
  backward_chunked(dgamma, dbeta, rows, c, [&](std::int64_t r, float* pg, float* pb) {
    const float* yr = y + r * c;
    backward_row(dx + r * c, pg, pb, dy + r * c, gamma, rstd[r], c,
                 [yr, beta, ig](std::int64_t j) { return (yr[j] - beta[j]) * ig[j]; });
  });
}

void layernorm_forward_ref(float* y, float* mean, float* rstd, const float* x, const float* gamma,
                           const float* beta, float eps, std::int64_t rows, std::int64_t c) {
  check_sizes(rows, c);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * c;
    double m = 0.0;
    for (std::int64_t j = 0; j < c; ++j)
      m += xr[j];
    m /= static_cast<double>(c);
    double var = 0.0;
    for (std::int64_t j = 0; j < c; ++j)
      var += (xr[j] - m) * (xr[j] - m);
    var /= static_cast<double>(c);
    const double s = 1.0 / std::sqrt(var + static_cast<double>(eps));
    for (std::int64_t j = 0; j < c; ++j)
      y[r * c + j] = static_cast<float>((xr[j] - m) * s * gamma[j] + beta[j]);
    if (mean)
      mean[r] = static_cast<float>(m);
    if (rstd)
      rstd[r] = static_cast<float>(s);
  }
}

void layernorm_backward_ref(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                            const float* mean, const float* rstd, const float* gamma,
                            std::int64_t rows, std::int64_t c) {
  check_sizes(rows, c);
  std::vector<double> dg(static_cast<std::size_t>(c), 0.0), db(static_cast<std::size_t>(c), 0.0);
  std::vector<double> xhat(static_cast<std::size_t>(c)), dxhat(static_cast<std::size_t>(c));
  for (std::int64_t r = 0; r < rows; ++r) {
    const double m = mean[r], s = rstd[r];
    double m1 = 0.0, m2 = 0.0;
    for (std::int64_t j = 0; j < c; ++j) {
      const auto u = static_cast<std::size_t>(j);
      const double g = dy[r * c + j];
      xhat[u] = (x[r * c + j] - m) * s;
      dxhat[u] = g * gamma[j];
      m1 += dxhat[u];
      m2 += dxhat[u] * xhat[u];
      dg[u] += g * xhat[u];
      db[u] += g;
    }
    m1 /= static_cast<double>(c);
    m2 /= static_cast<double>(c);
    for (std::int64_t j = 0; j < c; ++j) {
      const auto u = static_cast<std::size_t>(j);
      dx[r * c + j] = static_cast<float>(s * (dxhat[u] - m1 - xhat[u] * m2));
    }
  }
  for (std::int64_t j = 0; j < c; ++j) {
    const auto u = static_cast<std::size_t>(j);
    if (dgamma)
      dgamma[j] = static_cast<float>(dgamma[j] + dg[u]);
    if (dbeta)
      dbeta[j] = static_cast<float>(dbeta[j] + db[u]);
  }
}

} // namespace dsa::cpu
