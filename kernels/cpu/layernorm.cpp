// LayerNorm on CPU: OpenMP over rows, SIMD inner loops, fixed-order reductions of
// dgamma/dbeta so gradients are bit-identical run to run whatever the thread count. The
// loops (layernorm_impl.inc) are compiled twice: for the build's target and for AVX-512
// (16-lane vectors), chosen by active_isa(). The two vector widths add a row's sums in
// different orders, so the paths agree within rounding, each checked against the double
// references.
#include "kernels/cpu/layernorm.hpp"

#include "core/error.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/dropout.hpp"
#include "kernels/cpu/isa.hpp"

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

} // namespace

namespace base_path {
#include "kernels/cpu/layernorm_impl.inc"
} // namespace base_path

DSA_AVX512_REGION_BEGIN
namespace avx512_path {
#include "kernels/cpu/layernorm_impl.inc"
} // namespace avx512_path
DSA_AVX512_REGION_END

void layernorm_forward(isa path, float* y, float* mean, float* rstd, const float* x, const float* gamma,
                       const float* beta, float eps, std::int64_t rows, std::int64_t c) {
  check_sizes(rows, c);
  check_path(path, "layernorm");
  if (path == isa::avx512) return avx512_path::forward(y, mean, rstd, x, gamma, beta, eps, rows, c);
  base_path::forward(y, mean, rstd, x, gamma, beta, eps, rows, c);
}

void layernorm_backward(isa path, float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                        const float* mean, const float* rstd, const float* gamma, std::int64_t rows,
                        std::int64_t c) {
  check_sizes(rows, c);
  check_path(path, "layernorm");
  if (path == isa::avx512) return avx512_path::backward(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, c);
  base_path::backward(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, c);
}

void layernorm_backward(isa path, const layernorm_backward_args& a, std::int64_t rows, std::int64_t c) {
  check_sizes(rows, c);
  check_path(path, "layernorm");
  DSA_CHECK(a.dx && a.dy && a.x && a.mean && a.rstd && a.gamma, "layernorm_backward: a missing input or output");
  DSA_CHECK(a.x_type == dtype::f32 || a.x_type == dtype::f16 || a.x_type == dtype::bf16,
            "layernorm_backward: an input of {}; expected f32, f16 or bf16", dtype_name(a.x_type));
  DSA_CHECK(!a.dropped || (a.dropped != a.dx && a.dropped != a.dy), "layernorm_backward: dropped aliases dx or dy");
  DSA_CHECK(a.p >= 0.0f && a.p < 1.0f, "layernorm_backward: p={} outside [0, 1)", a.p);
  if (a.dropped) check_dropout_elements(rows * c, "layernorm_backward");
  if (path == isa::avx512) return avx512_path::backward_fused(path, a, rows, c);
  base_path::backward_fused(path, a, rows, c);
}

void residual_layernorm_forward(isa path, const residual_layernorm_args& a, std::int64_t rows, std::int64_t c) {
  check_sizes(rows, c);
  check_path(path, "layernorm");
  DSA_CHECK(a.product && a.bias && a.residual, "residual_layernorm_forward: product, bias and residual are needed");
  DSA_CHECK(a.p >= 0.0f && a.p < 1.0f, "residual_layernorm_forward: p={} outside [0, 1)", a.p);
  DSA_CHECK(a.sum == nullptr || a.sum != a.residual, "residual_layernorm_forward: sum may not alias the residual");
  check_dropout_elements(rows * c, "residual_layernorm_forward");
  DSA_CHECK(!a.gamma || (a.beta && a.y), "residual_layernorm_forward: a LayerNorm needs beta and y");
  DSA_CHECK(a.gamma || (a.sum || a.sum_half), "residual_layernorm_forward: no output");
  DSA_CHECK(!(a.sum_half || a.y_half) || a.half_type == dtype::f16 || a.half_type == dtype::bf16,
            "residual_layernorm_forward: half outputs of {}; expected f16 or bf16", dtype_name(a.half_type));
  if (path == isa::avx512) return avx512_path::residual_forward(path, a, rows, c);
  base_path::residual_forward(path, a, rows, c);
}

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* gamma,
                       const float* beta, float eps, std::int64_t rows, std::int64_t c) {
  layernorm_forward(active_isa(), y, mean, rstd, x, gamma, beta, eps, rows, c);
}

void layernorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                        const float* mean, const float* rstd, const float* gamma, std::int64_t rows,
                        std::int64_t c) {
  layernorm_backward(active_isa(), dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, c);
}

void layernorm_backward_from_output(float* dx, float* dgamma, float* dbeta, const float* dy,
                                    const float* y, const float* rstd, const float* gamma,
                                    const float* beta, std::int64_t rows, std::int64_t c) {
  layernorm_backward_from_output(active_isa(), dx, dgamma, dbeta, dy, y, rstd, gamma, beta, rows, c);
}

void layernorm_backward_from_output(isa path, float* dx, float* dgamma, float* dbeta, const float* dy,
                                    const float* y, const float* rstd, const float* gamma,
                                    const float* beta, std::int64_t rows, std::int64_t c) {
  check_sizes(rows, c);
  check_path(path, "layernorm");
  std::vector<float> inv_gamma(static_cast<std::size_t>(c));
  for (std::int64_t j = 0; j < c; ++j) {
    DSA_CHECK(gamma[j] != 0.0f, "layernorm_backward_from_output: gamma[{}] is zero", j);
    inv_gamma[static_cast<std::size_t>(j)] = 1.0f / gamma[j];
  }
  if (path == isa::avx512)
    return avx512_path::backward_from_output(dx, dgamma, dbeta, dy, y, rstd, gamma, beta, inv_gamma.data(), rows, c);
  base_path::backward_from_output(dx, dgamma, dbeta, dy, y, rstd, gamma, beta, inv_gamma.data(), rows, c);
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
