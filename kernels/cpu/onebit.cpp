// 1-bit compression kernels; see onebit.hpp. The AVX2 loops where the build targets it
// (the default, x86-64-v3) and the path asks for them, the plain loops otherwise; both give
// the same bits.
#include "kernels/cpu/onebit.hpp"

#include "core/error.hpp"

#include <array>
#include <cmath>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace dsa::cpu {
namespace {

// signs[b][k]: +1 or -1 for bit 7 - k of byte b (the byte's first element in its top bit).
struct sign_table {
  alignas(32) std::array<std::array<float, 8>, 256> signs{};
  // reversed[m]: m with its 8 bits in the opposite order (a movemask, lane 0 in bit 0,
  // as a packed byte, element 0 in bit 7).
  std::array<std::uint8_t, 256> reversed{};
  sign_table() {
    for (int b = 0; b < 256; ++b) {
      int r = 0;
      for (int k = 0; k < 8; ++k) {
        signs[static_cast<std::size_t>(b)][static_cast<std::size_t>(k)] = (b >> (7 - k)) & 1 ? 1.0f : -1.0f;
        r |= ((b >> k) & 1) << (7 - k);
      }
      reversed[static_cast<std::size_t>(b)] = static_cast<std::uint8_t>(r);
    }
  }
};

const sign_table& table() {
  static const sign_table t;
  return t;
}

void check_multiple(std::int64_t n, const char* who) {
  DSA_CHECK(n >= 0 && n % 8 == 0, "{}: {} elements, not a multiple of 8", who, n);
}

// Whether `path` runs the AVX2 loops (compiled only when the build targets AVX2).
bool vector_path(isa path, const char* who) {
  check_path(path, who);
#if defined(__AVX2__)
  return path != isa::scalar;
#else
  return false;
#endif
}

#if defined(__AVX2__)
// The partial sums of the first whole multiples of 8 elements into s; returns how many.
std::int64_t sum_of_squares_avx2(const float* y, std::int64_t n, double* s) {
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd(); // partial sums 0-3 and 4-7
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(y + i);
    const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    lo = _mm256_add_pd(lo, _mm256_mul_pd(a, a)); // a float's square is exact in double
    hi = _mm256_add_pd(hi, _mm256_mul_pd(b, b));
  }
  _mm256_storeu_pd(s, lo);
  _mm256_storeu_pd(s + 4, hi);
  return i;
}

// Signs and errors of y (kept in error), n a multiple of 8.
void compress_avx2(float* error, std::uint8_t* bits, std::int64_t n, float scale) {
  const auto& t = table();
  const __m256 up = _mm256_set1_ps(scale), down = _mm256_set1_ps(-scale), zero = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < n; i += 8) {
    const __m256 y = _mm256_loadu_ps(error + i);
    const __m256 positive = _mm256_cmp_ps(y, zero, _CMP_GE_OQ); // -0 and +0 count as +1, NaN as -1
    bits[i / 8] = t.reversed[static_cast<std::size_t>(_mm256_movemask_ps(positive))];
    _mm256_storeu_ps(error + i, _mm256_sub_ps(y, _mm256_blendv_ps(down, up, positive)));
  }
}
#endif

} // namespace

double onebit_sum_of_squares(isa path, const float* y, std::int64_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
#if defined(__AVX2__)
  if (vector_path(path, "onebit_sum_of_squares")) i = sum_of_squares_avx2(y, n, s);
#else
  check_path(path, "onebit_sum_of_squares");
#endif
  for (; i < n; ++i) {
    const double v = y[i];
    s[i % 8] += v * v;
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

float onebit_compress(isa path, const float* x, float* error, std::uint8_t* bits, std::int64_t n) {
  check_multiple(n, "onebit_compress");
  for (std::int64_t i = 0; i < n; ++i) error[i] = x[i] + error[i]; // y, kept in error
  const float scale =
      n == 0 ? 0.0f : static_cast<float>(std::sqrt(onebit_sum_of_squares(path, error, n) / static_cast<double>(n)));
#if defined(__AVX2__)
  if (vector_path(path, "onebit_compress")) {
    compress_avx2(error, bits, n, scale);
    return scale;
  }
#endif
  for (std::int64_t i = 0; i < n; i += 8) {
    unsigned byte = 0;
    for (int k = 0; k < 8; ++k) {
      const float y = error[i + k];
      const bool positive = y >= 0.0f;
      byte |= static_cast<unsigned>(positive) << (7 - k);
      error[i + k] = y - (positive ? scale : -scale);
    }
    bits[i / 8] = static_cast<std::uint8_t>(byte);
  }
  return scale;
}

void onebit_accumulate(isa path, const std::uint8_t* bits, float scale, float* acc, std::int64_t n) {
  check_multiple(n, "onebit_accumulate");
  const auto& t = table();
  std::int64_t i = 0;
  const bool vector = vector_path(path, "onebit_accumulate");
  (void)vector;
#if defined(__AVX2__)
  const __m256 s = _mm256_set1_ps(scale);
  for (; vector && i < n; i += 8) {
    const __m256 sign = _mm256_load_ps(t.signs[bits[i / 8]].data());
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(s, sign)));
  }
#endif
  for (; i < n; i += 8)
    for (int k = 0; k < 8; ++k) acc[i + k] += scale * t.signs[bits[i / 8]][static_cast<std::size_t>(k)];
}

void onebit_expand(isa path, const std::uint8_t* bits, float scale, float* out, std::int64_t n) {
  check_multiple(n, "onebit_expand");
  const auto& t = table();
  std::int64_t i = 0;
  const bool vector = vector_path(path, "onebit_expand");
  (void)vector;
#if defined(__AVX2__)
  const __m256 s = _mm256_set1_ps(scale);
  for (; vector && i < n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_load_ps(t.signs[bits[i / 8]].data())));
#endif
  for (; i < n; i += 8)
    for (int k = 0; k < 8; ++k) out[i + k] = scale * t.signs[bits[i / 8]][static_cast<std::size_t>(k)];
}

double onebit_sum_of_squares(const float* y, std::int64_t n) { return onebit_sum_of_squares(active_isa(), y, n); }

float onebit_compress(const float* x, float* error, std::uint8_t* bits, std::int64_t n) {
  return onebit_compress(active_isa(), x, error, bits, n);
}

void onebit_accumulate(const std::uint8_t* bits, float scale, float* acc, std::int64_t n) {
  onebit_accumulate(active_isa(), bits, scale, acc, n);
}

void onebit_expand(const std::uint8_t* bits, float scale, float* out, std::int64_t n) {
  onebit_expand(active_isa(), bits, scale, out, n);
}

} // namespace dsa::cpu
