// GELU (erf form) and tanh. GELU uses the branch-free erf and exp of vec_math: on the
// AVX-512 path their 16-lane forms (vec_math512.hpp), on the AVX2 path (when built for
// it) the 8-lane ones, with the same bits; else `omp simd` loops. tanh is a scalar libm
// call. Buffers above a threshold are split across OpenMP threads.
#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/convert.hpp"

#include "core/error.hpp"
#include "kernels/cpu/vec_math.hpp"
#include "kernels/cpu/vec_math512.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace dsa::cpu {
namespace {

// Below this many elements one thread does the whole buffer.
constexpr std::int64_t parallel_threshold = std::int64_t{1} << 15;
constexpr std::int64_t chunk_elements = std::int64_t{1} << 13;

template <class Fn> void for_chunks(std::int64_t n, Fn fn) {
  DSA_CHECK(n >= 0, "activation: n = {}", n);
  cpu::for_chunks(n, chunk_elements, parallel_threshold, fn);
}

constexpr double inv_sqrt2 = 0.70710678118654752440;
constexpr double inv_sqrt_2pi = 0.39894228040143267794;

} // namespace

// Each path's form of the two kernels on elements [b, e) (one chunk).
namespace {

void gelu_forward_scalar(float* y, const float* x, std::int64_t b, std::int64_t e) {
#pragma omp simd
  for (std::int64_t i = b; i < e; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + vec::erf(v * static_cast<float>(inv_sqrt2)));
  }
}

// gelu'(x) = Phi(x) + x * phi(x), with Phi the normal CDF and phi its density.
void gelu_backward_scalar(float* dx, const float* dy, const float* x, std::int64_t b, std::int64_t e) {
#pragma omp simd
  for (std::int64_t i = b; i < e; ++i) {
    const float v = x[i];
    const float cdf = 0.5f * (1.0f + vec::erf(v * static_cast<float>(inv_sqrt2)));
    const float pdf = static_cast<float>(inv_sqrt_2pi) * vec::exp_nonpositive(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

#if DSA_VEC_MATH_AVX2

// Loads and stores of 8 lanes: all of them, or the first few through masks (the tail, so
// that every element takes the same arithmetic). Masked stores are slow on some CPUs.
struct all_lanes {
  __m256 load(const float* p) const { return _mm256_loadu_ps(p); }
  void store(float* p, __m256 v) const { _mm256_storeu_ps(p, v); }
};
struct first_lanes {
  __m256i mask;
  __m256 load(const float* p) const { return _mm256_maskload_ps(p, mask); }
  void store(float* p, __m256 v) const { _mm256_maskstore_ps(p, mask, v); }
};

// Runs lane_fn(i, lanes) on 8 elements at a time over [b, e).
template <class LaneFn> void for_lanes(std::int64_t b, std::int64_t e, LaneFn lane_fn) {
  std::int64_t i = b;
  for (; i + 8 <= e; i += 8)
    lane_fn(i, all_lanes{});
  if (i < e)
    lane_fn(i, first_lanes{vec::first_lanes(e - i)});
}

void gelu_forward_avx2(float* y, const float* x, std::int64_t b, std::int64_t e) {
  for_lanes(b, e, [&](std::int64_t i, auto lanes) {
    const __m256 v = lanes.load(x + i);
    const __m256 half_v = _mm256_mul_ps(_mm256_set1_ps(0.5f), v);
    const __m256 erf_v = vec::erf(_mm256_mul_ps(v, _mm256_set1_ps(static_cast<float>(inv_sqrt2))));
    lanes.store(y + i, _mm256_fmadd_ps(half_v, erf_v, half_v));
  });
}

void gelu_backward_avx2(float* dx, const float* dy, const float* x, std::int64_t b, std::int64_t e) {
  for_lanes(b, e, [&](std::int64_t i, auto lanes) {
    const __m256 v = lanes.load(x + i);
    const __m256 half = _mm256_set1_ps(0.5f);
    const __m256 erf_v = vec::erf(_mm256_mul_ps(v, _mm256_set1_ps(static_cast<float>(inv_sqrt2))));
    const __m256 cdf = _mm256_fmadd_ps(half, erf_v, half);
    const __m256 minus_half_v2 = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(-0.5f), v), v);
    const __m256 pdf =
        _mm256_mul_ps(_mm256_set1_ps(static_cast<float>(inv_sqrt_2pi)), vec::exp_nonpositive(minus_half_v2));
    lanes.store(dx + i, _mm256_mul_ps(lanes.load(dy + i), _mm256_fmadd_ps(v, pdf, cdf)));
  });
}

#endif // DSA_VEC_MATH_AVX2

// The AVX2 forms' operations on 16 lanes (the same bits), the tail through a lane mask.
DSA_AVX512_CODE_BEGIN

DSA_AVX512_TARGET inline __m512 gelu_value512(__m512 v) {
  const __m512 half_v = _mm512_mul_ps(_mm512_set1_ps(0.5f), v);
  const __m512 erf_v = vec512::erf(_mm512_mul_ps(v, _mm512_set1_ps(static_cast<float>(inv_sqrt2))));
  return _mm512_fmadd_ps(half_v, erf_v, half_v);
}

DSA_AVX512_TARGET inline __m512 gelu_grad512(__m512 v, __m512 g) {
  const __m512 half = _mm512_set1_ps(0.5f);
  const __m512 erf_v = vec512::erf(_mm512_mul_ps(v, _mm512_set1_ps(static_cast<float>(inv_sqrt2))));
  const __m512 cdf = _mm512_fmadd_ps(half, erf_v, half);
  const __m512 minus_half_v2 = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(-0.5f), v), v);
  const __m512 pdf =
      _mm512_mul_ps(_mm512_set1_ps(static_cast<float>(inv_sqrt_2pi)), vec512::exp_nonpositive(minus_half_v2));
  return _mm512_mul_ps(g, _mm512_fmadd_ps(v, pdf, cdf));
}

DSA_AVX512_TARGET void gelu_forward_avx512(float* y, const float* x, std::int64_t b, std::int64_t e) {
  std::int64_t i = b;
  for (; i + 16 <= e; i += 16) _mm512_storeu_ps(y + i, gelu_value512(_mm512_loadu_ps(x + i)));
  if (i < e) {
    const __mmask16 k = vec512::first_lanes(e - i);
    _mm512_mask_storeu_ps(y + i, k, gelu_value512(_mm512_maskz_loadu_ps(k, x + i)));
  }
}

DSA_AVX512_TARGET void gelu_backward_avx512(float* dx, const float* dy, const float* x, std::int64_t b,
                                            std::int64_t e) {
  std::int64_t i = b;
  for (; i + 16 <= e; i += 16)
    _mm512_storeu_ps(dx + i, gelu_grad512(_mm512_loadu_ps(x + i), _mm512_loadu_ps(dy + i)));
  if (i < e) {
    const __mmask16 k = vec512::first_lanes(e - i);
    _mm512_mask_storeu_ps(dx + i, k, gelu_grad512(_mm512_maskz_loadu_ps(k, x + i), _mm512_maskz_loadu_ps(k, dy + i)));
  }
}

DSA_AVX512_CODE_END

// One path's GELU forward / backward on elements [b, e).
void gelu_forward_range(isa path, float* y, const float* x, std::int64_t b, std::int64_t e) {
  if (path == isa::avx512) return gelu_forward_avx512(y, x, b, e);
#if DSA_VEC_MATH_AVX2
  if (path == isa::avx2) return gelu_forward_avx2(y, x, b, e);
#endif
  gelu_forward_scalar(y, x, b, e);
}

void gelu_backward_range(isa path, float* dx, const float* dy, const float* x, std::int64_t b, std::int64_t e) {
  if (path == isa::avx512) return gelu_backward_avx512(dx, dy, x, b, e);
#if DSA_VEC_MATH_AVX2
  if (path == isa::avx2) return gelu_backward_avx2(dx, dy, x, b, e);
#endif
  gelu_backward_scalar(dx, dy, x, b, e);
}

void check_bias_sizes(std::int64_t rows, std::int64_t c, const char* who) {
  DSA_CHECK(rows >= 0 && c >= 0, "{}: rows = {}, c = {}", who, rows, c);
}

// Columns per block of gelu_bias_backward: its double accumulators stay in L1 (as bias_backward's).
constexpr std::int64_t bias_column_block = 256;

// Calls fn(r0, r1) over the rows of a (rows, c) buffer, a few rows per OpenMP chunk when it
// is large (the elementwise kernels' chunk and threshold, counted in rows).
template <class Fn> void for_row_chunks(std::int64_t rows, std::int64_t c, Fn fn) {
  const std::int64_t rows_per_chunk = std::max<std::int64_t>(1, chunk_elements / std::max<std::int64_t>(c, 1));
  cpu::for_chunks(rows, rows_per_chunk, c == 0 ? rows + 1 : parallel_threshold / c, fn);
}

} // namespace

void gelu_bias_forward(isa path, float* y, float* x, const float* bias, std::int64_t rows, std::int64_t c) {
  check_path(path, "gelu_bias_forward");
  check_bias_sizes(rows, c, "gelu_bias_forward");
  for_row_chunks(rows, c, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      float* row = x + r * c;
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j) row[j] += bias[j];
      gelu_forward_range(path, y, x, r * c, (r + 1) * c); // the row is still in L1
    }
  });
}

void gelu_bias_backward(isa path, float* dx, float* dbias, const float* dy, const float* x, std::int64_t rows,
                        std::int64_t c) {
  gelu_bias_backward(path, dx, dbias, dy, x, dtype::f32, rows, c);
}

void gelu_bias_backward(isa path, float* dx, float* dbias, const float* dy, const void* x, dtype x_type,
                        std::int64_t rows, std::int64_t c) {
  gelu_bias_backward(path, dx, nullptr, dbias, dy, x, x_type, rows, c);
}

void gelu_bias_backward(isa path, float* dx, std::uint16_t* dx_bf16, float* dbias, const float* dy, const void* x,
                        dtype x_type, std::int64_t rows, std::int64_t c) {
  check_path(path, "gelu_bias_backward");
  check_bias_sizes(rows, c, "gelu_bias_backward");
  DSA_CHECK(x_type == dtype::f32 || x_type == dtype::f16 || x_type == dtype::bf16,
            "gelu_bias_backward: an input of {}; expected f32, f16 or bf16", dtype_name(x_type));
  DSA_CHECK((dx == nullptr) != (dx_bf16 == nullptr), "gelu_bias_backward: exactly one of dx and dx_bf16");
  if (dx_bf16) { // each row's slice is read from dy after earlier ones were written
    const auto out = reinterpret_cast<std::uintptr_t>(dx_bf16), in = reinterpret_cast<std::uintptr_t>(dy);
    const auto n = static_cast<std::uintptr_t>(rows * c);
    DSA_CHECK(out + 2 * n <= in || in + 4 * n <= out, "gelu_bias_backward: dx_bf16 overlaps dy");
  }
  if (rows == 0) return; // dbias untouched (as bias_backward's caller left it: -0.0 stays)
  const std::int64_t blocks = (c + bias_column_block - 1) / bias_column_block;
  const auto* x32 = static_cast<const float*>(x);
  const auto* x16 = static_cast<const std::uint16_t*>(x);
#pragma omp parallel for schedule(static) if (rows * c >= parallel_threshold && blocks > 1)
  for (std::int64_t block = 0; block < blocks; ++block) {
    const std::int64_t j0 = block * bias_column_block, width = std::min(c, j0 + bias_column_block) - j0;
    double acc[bias_column_block] = {};
    float widened[bias_column_block]; // a half x's slice of the row, widened exactly
    float slice[bias_column_block];   // the gradient's slice when only its rounding is kept
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t at = r * c + j0;
      const float* xs = x32 + at;
      if (x_type != dtype::f32) {
        cast(path, widened, dtype::f32, x16 + at, x_type, width);
        xs = widened;
      }
      float* d = dx ? dx + at : slice;
      gelu_backward_range(path, d, dy + at, xs, 0, width);
#pragma omp simd
      for (std::int64_t j = 0; j < width; ++j) acc[j] += static_cast<double>(d[j]);
      if (dx_bf16) cast(path, dx_bf16 + at, dtype::bf16, d, dtype::f32, width);
    }
    for (std::int64_t j = 0; j < width; ++j)
      dbias[j0 + j] = static_cast<float>(static_cast<double>(dbias[j0 + j]) + acc[j]);
  }
}

void gelu_bias_forward_half(isa path, std::uint16_t* y, std::uint16_t* x_out, dtype half, const float* x,
                            const float* bias, std::int64_t rows, std::int64_t c) {
  check_path(path, "gelu_bias_forward_half");
  check_bias_sizes(rows, c, "gelu_bias_forward_half");
  DSA_CHECK(half == dtype::f16 || half == dtype::bf16, "gelu_bias_forward_half: outputs of {}; expected f16 or bf16",
            dtype_name(half));
  for_row_chunks(rows, c, [&](std::int64_t r0, std::int64_t r1) {
    // x + bias, then its GELU: one buffer per thread, not one per chunk (an 8 KiB block from
    // malloc's bins per chunk at BERT-base widths).
    thread_local std::vector<float> row;
    row.resize(static_cast<std::size_t>(2 * c));
    float* biased = row.data();
    float* activated = biased + c;
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* in = x + r * c;
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j) biased[j] = in[j] + bias[j];
      cast(path, x_out + r * c, half, biased, dtype::f32, c);
      gelu_forward_range(path, activated, biased, 0, c);
      cast(path, y + r * c, half, activated, dtype::f32, c);
    }
  });
}

void gelu_bias_forward(float* y, float* x, const float* bias, std::int64_t rows, std::int64_t c) {
  gelu_bias_forward(active_isa(), y, x, bias, rows, c);
}

void gelu_bias_backward(float* dx, float* dbias, const float* dy, const float* x, std::int64_t rows, std::int64_t c) {
  gelu_bias_backward(active_isa(), dx, dbias, dy, x, rows, c);
}

void gelu_forward(isa path, float* y, const float* x, std::int64_t n) {
  check_path(path, "gelu_forward");
  for_chunks(n, [&](std::int64_t b, std::int64_t e) { gelu_forward_range(path, y, x, b, e); });
}

void gelu_backward(isa path, float* dx, const float* dy, const float* x, std::int64_t n) {
  check_path(path, "gelu_backward");
  for_chunks(n, [&](std::int64_t b, std::int64_t e) { gelu_backward_range(path, dx, dy, x, b, e); });
}

void gelu_forward(float* y, const float* x, std::int64_t n) { gelu_forward(active_isa(), y, x, n); }

void gelu_backward(float* dx, const float* dy, const float* x, std::int64_t n) {
  gelu_backward(active_isa(), dx, dy, x, n);
}

void tanh_forward(float* y, const float* x, std::int64_t n) {
  for_chunks(n, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      y[i] = std::tanh(x[i]);
  });
}

void tanh_backward(float* dx, const float* dy, const float* y, std::int64_t n) {
  for_chunks(n, [&](std::int64_t b, std::int64_t e) {
#pragma omp simd
    for (std::int64_t i = b; i < e; ++i)
      dx[i] = dy[i] * (1.0f - y[i] * y[i]);
  });
}

void gelu_forward_ref(float* y, const float* x, std::int64_t n) {
  DSA_CHECK(n >= 0, "gelu_forward_ref: n = {}", n);
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    y[i] = static_cast<float>(0.5 * v * (1.0 + std::erf(v * inv_sqrt2)));
  }
}

void gelu_backward_ref(float* dx, const float* dy, const float* x, std::int64_t n) {
  DSA_CHECK(n >= 0, "gelu_backward_ref: n = {}", n);
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double cdf = 0.5 * (1.0 + std::erf(v * inv_sqrt2));
    const double pdf = inv_sqrt_2pi * std::exp(-0.5 * v * v);
    dx[i] = static_cast<float>(static_cast<double>(dy[i]) * (cdf + v * pdf));
  }
}

} // namespace dsa::cpu
