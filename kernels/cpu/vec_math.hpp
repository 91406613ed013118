// Branch-free float math for the vectorized CPU kernels: exp on (-inf, 0] and erf. Scalar
// forms are written so that `omp simd` loops vectorize them; with AVX2 + FMA there are
// 8-lane intrinsic forms too. Header-only; no state, callable from any thread.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define DSA_VEC_MATH_AVX2 1
#else
#define DSA_VEC_MATH_AVX2 0
#endif

namespace dsa::cpu::vec {

// exp(x) for x <= 0 with ~1 ulp error, written without calls or branches so that
// `omp simd` loops vectorize it (libm's expf does not vectorize without -ffast-math).
// x = n ln2 + r, |r| <= ln2/2, exp(r) by a degree-7 Taylor polynomial (truncation
// < 1e-8 relative), times 2^n built in the exponent bits. Results below ~2^-126.5
// (x < -87.7, -inf included) are exactly 0: subnormals flushed, n stays >= -127.
// softmax and cross-entropy depend on its exact results: change it only with their tests.
inline float exp_nonpositive(float x) {
  // Clamp to >= -88 by an unsigned min of the bits (for negative floats the pattern
  // grows with magnitude): a float compare is a possible trap that stops GCC's
  // if-conversion, and so vectorization, under the default -ftrapping-math.
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u = u < 0xC2B00000u ? u : 0xC2B00000u; // -88.0f
  std::memcpy(&x, &u, sizeof x);
  // Round to nearest by the 1.5 * 2^23 trick (|x log2 e| < 2^22); nearbyint is a call.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

namespace erf_detail {

// erf(x) = x + x * small(x^2) for |x| <= 1: minimax in relative error of erf on [0, 1]
// (fitted in long double by Lawson's algorithm); the leading 2/sqrt(pi) - 1 keeps the
// last rounding on the fma with x, not on a coefficient near 1.
constexpr float small[] = {1.283791660e-01f, -3.761262584e-01f, 1.128358527e-01f, -2.685381607e-02f,
                           5.188334503e-03f, -8.010247665e-04f, 7.854026344e-05f};
constexpr int small_count = sizeof small / sizeof small[0];
// erf(a) = 1 - exp(large(a - 1)) for 1 < a <= 4, large ~ log(erfc(a)): minimax weighted by
// erfc(a) / erf(a), i.e. in units of the result's ulp. Above 4, erf rounds to 1 in float
// (from 3.92 on), so a is clamped to 4.
constexpr float large[] = {-1.849605510e+00f, -2.638967529e+00f, -8.431068759e-01f,
                           -4.156462513e-02f, 1.004955922e-02f,  -2.016451390e-03f,
                           2.930165804e-04f,  -2.305755065e-05f, 2.120857557e-07f};
constexpr int large_count = sizeof large / sizeof large[0];

constexpr std::uint32_t sign_bit = 0x80000000u;
constexpr std::uint32_t one_bits = 0x3F800000u;  // 1.0f
constexpr std::uint32_t four_bits = 0x40800000u; // 4.0f
constexpr std::uint32_t inf_bits = 0x7F800000u;

inline float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

} // namespace erf_detail

// erf(x) in float, max error ~1 ulp over the whole range (tests/kernels/test_activation),
// saturating to +-1, odd (erf(-0) = -0), NaN in -> NaN out. Both regions are computed and
// one is picked by integer masks (no float compares: see exp_nonpositive). Without FMA the
// roundings differ from the AVX2 form by an ulp or so.
inline float erf(float x) {
  using namespace erf_detail;
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const std::uint32_t abs_bits = bits & ~sign_bit;
  // For non-negative floats the bit pattern orders like the value, so these are min(|x|, c);
  // NaN patterns are above inf and clamp to c, keeping the polynomials finite.
  const float a_small = from_bits(abs_bits < one_bits ? abs_bits : one_bits);
  const float a_large = from_bits(abs_bits < four_bits ? abs_bits : four_bits);

  const float t = a_small * a_small;
  float p = small[small_count - 1];
  for (int i = small_count - 2; i >= 0; --i)
    p = p * t + small[i];
  const float r_small = a_small * p + a_small;

  const float s = a_large - 1.0f;
  float q = large[large_count - 1];
  for (int i = large_count - 2; i >= 0; --i)
    q = q * s + large[i];
  const float r_large = 1.0f - exp_nonpositive(q);

  std::uint32_t small_u, large_u;
  std::memcpy(&small_u, &r_small, sizeof small_u);
  std::memcpy(&large_u, &r_large, sizeof large_u);
  const std::uint32_t is_small = abs_bits <= one_bits ? 0xFFFFFFFFu : 0u;
  const std::uint32_t is_nan = abs_bits > inf_bits ? 0xFFFFFFFFu : 0u;
  const std::uint32_t r = ((small_u & is_small) | (large_u & ~is_small)) | (bits & sign_bit);
  return from_bits((r & ~is_nan) | (bits & is_nan));
}

#if DSA_VEC_MATH_AVX2

// 8-lane exp(x) for x <= 0: the scheme of exp_nonpositive(float), evaluated with FMA, so a
// lane may differ from the scalar form by an ulp. Results below ~2^-126.5 are 0.
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-88.0f), x); // max_ps returns x when x is NaN
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i exponent = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(exponent, 23)));
}

// 8-lane erf: the scheme of erf(float) with FMA; same accuracy bound.
inline __m256 erf(__m256 x) {
  using namespace erf_detail;
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(sign_bit)));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 ax = _mm256_andnot_ps(sign, x);
  // min_ps returns its second operand when either is NaN: NaN lanes clamp to the constant.
  const __m256 a_small = _mm256_min_ps(ax, one);
  const __m256 a_large = _mm256_min_ps(ax, _mm256_set1_ps(4.0f));

  const __m256 t = _mm256_mul_ps(a_small, a_small);
  __m256 p = _mm256_set1_ps(small[small_count - 1]);
  for (int i = small_count - 2; i >= 0; --i)
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(small[i]));
  const __m256 r_small = _mm256_fmadd_ps(a_small, p, a_small);

  const __m256 s = _mm256_sub_ps(a_large, one);
  __m256 q = _mm256_set1_ps(large[large_count - 1]);
  for (int i = large_count - 2; i >= 0; --i)
    q = _mm256_fmadd_ps(q, s, _mm256_set1_ps(large[i]));
  const __m256 r_large = _mm256_sub_ps(one, exp_nonpositive(q));

  const __m256 is_small = _mm256_cmp_ps(ax, one, _CMP_LE_OQ);
  __m256 r = _mm256_blendv_ps(r_large, r_small, is_small);
  r = _mm256_or_ps(r, _mm256_and_ps(x, sign));
  return _mm256_blendv_ps(r, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// 8 floats to bf16, rounded to nearest even, a NaN kept as a quiet NaN: the same bits
// as core/half.hpp's f32_to_bf16 for every input.
inline __m128i f32_to_bf16_8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i high = _mm256_srli_epi32(u, 16);
  // (u + 0x7fff + lsb) >> 16: ties go to the even upper half.
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(high, _mm256_set1_epi32(1)))),
      16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i result = _mm256_blendv_epi8(rounded, _mm256_or_si256(high, _mm256_set1_epi32(0x40)), nan);
  // Every lane is in [0, 0xffff], so unsigned saturation is exact; packus works per
  // 128-bit half, the permute gathers the two low quadwords.
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(result, result), 0x08));
}

// 8 floats to f16: the hardware's round to nearest even, then NaN lanes replaced by the
// canonical quiet NaN (sign | 0x7e00) that core/half.hpp's f32_to_f16 returns.
inline __m128i f32_to_f16_8(__m256 x) {
  const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
  const __m128i canonical =
      _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(static_cast<short>(0x8000))), _mm_set1_epi16(0x7e00));
  return _mm_blendv_epi8(h, canonical, nan16);
}

// Stores 8 floats as f16 or bf16, with core/half.hpp's bits (NaNs included).
inline void store_half8(std::uint16_t* out, __m256 x, bool bf16) {
  const __m128i h = bf16 ? f32_to_bf16_8(x) : f32_to_f16_8(x);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), h);
}

// Lane mask of the first `count` lanes (0 <= count <= 8), for maskload / maskstore tails.
inline __m256i first_lanes(std::int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

#endif // DSA_VEC_MATH_AVX2

// y[i] = erf(x[i]) for i < n; y may alias x. The AVX2 form on every element when built with
// AVX2 + FMA (the tail through masked loads, so results do not depend on position).
inline void erf(float* y, const float* x, std::int64_t n) {
#if DSA_VEC_MATH_AVX2
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, erf(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i mask = first_lanes(n - i);
    _mm256_maskstore_ps(y + i, mask, erf(_mm256_maskload_ps(x + i, mask)));
  }
#else
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i)
    y[i] = erf(x[i]);
#endif
}

} // namespace dsa::cpu::vec
