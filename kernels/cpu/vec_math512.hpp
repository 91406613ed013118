// 16-lane AVX-512 forms of vec_math.hpp's exp and erf, for kernels' AVX-512 paths
// (functions marked DSA_AVX512_TARGET, called only when cpu::active_isa() is avx512). Each
// is the 8-lane AVX2 form's sequence of operations on wider registers (the same FMAs,
// roundings, clamps and NaN handling), so every lane gives the AVX2 form's bits.
#pragma once

#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/vec_math.hpp"

#include <immintrin.h>

#include <cstdint>

namespace dsa::cpu::vec512 {

DSA_AVX512_CODE_BEGIN

// Lane mask of the first `count` lanes (0 <= count <= 16), for masked tails.
DSA_AVX512_TARGET inline __mmask16 first_lanes(std::int64_t count) {
  return static_cast<__mmask16>((1u << count) - 1u);
}

// exp(x) for x <= 0: vec::exp_nonpositive(__m256) on 16 lanes.
DSA_AVX512_TARGET inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-88.0f), x); // as max_ps on 8 lanes: x when x is NaN
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i exponent = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
  return _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32(exponent, 23)));
}

// erf: vec::erf(__m256) on 16 lanes.
DSA_AVX512_TARGET inline __m512 erf(__m512 x) {
  using namespace vec::erf_detail;
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(sign_bit));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 ax = _mm512_castsi512_ps(_mm512_andnot_si512(sign, _mm512_castps_si512(x)));
  const __m512 a_small = _mm512_min_ps(ax, one); // NaN lanes clamp to the constant
  const __m512 a_large = _mm512_min_ps(ax, _mm512_set1_ps(4.0f));

  const __m512 t = _mm512_mul_ps(a_small, a_small);
  __m512 p = _mm512_set1_ps(small[small_count - 1]);
  for (int i = small_count - 2; i >= 0; --i)
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(small[i]));
  const __m512 r_small = _mm512_fmadd_ps(a_small, p, a_small);

  const __m512 s = _mm512_sub_ps(a_large, one);
  __m512 q = _mm512_set1_ps(large[large_count - 1]);
  for (int i = large_count - 2; i >= 0; --i)
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(large[i]));
  const __m512 r_large = _mm512_sub_ps(one, exp_nonpositive(q));

  const __mmask16 is_small = _mm512_cmp_ps_mask(ax, one, _CMP_LE_OQ);
  __m512 r = _mm512_mask_blend_ps(is_small, r_large, r_small);
  r = _mm512_castsi512_ps(
      _mm512_or_si512(_mm512_castps_si512(r), _mm512_and_si512(_mm512_castps_si512(x), sign)));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, x);
}

// 16 floats to bf16 by vec::f32_to_bf16_8's integer rounding (nearest even; NaNs keep their
// upper half, quieted): core/half.hpp's bits.
DSA_AVX512_TARGET inline __m256i f32_to_bf16_16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i high = _mm512_srli_epi32(u, 16);
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)))),
      16);
  const __mmask16 nan =
      _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i result = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(result); // every lane is in [0, 0xffff]: the truncation is exact
}

// 16 floats to f16 as vec::f32_to_f16_8: round to nearest even, NaNs canonical (sign | 0x7e00).
DSA_AVX512_TARGET inline __m256i f32_to_f16_16(__m512 x) {
  const __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m256i canonical =
      _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16(static_cast<short>(0x8000))), _mm256_set1_epi16(0x7e00));
  return _mm256_mask_blend_epi16(nan, h, canonical);
}

// Stores 16 floats as f16 or bf16, with core/half.hpp's bits (NaNs included).
DSA_AVX512_TARGET inline void store_half16(std::uint16_t* out, __m512 x, bool bf16) {
  const __m256i h = bf16 ? f32_to_bf16_16(x) : f32_to_f16_16(x);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), h);
}

DSA_AVX512_CODE_END

} // namespace dsa::cpu::vec512
