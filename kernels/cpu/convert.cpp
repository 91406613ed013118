// Buffer conversion f32 <-> f16/bf16 and inf/nan detection.
//
// The scalar functions of core/half.hpp are the specification; the vector
// paths below produce the same bits for every input, NaN included:
//   f32 -> f16  F16C with round-to-nearest-even, then NaN lanes replaced by the
//               canonical quiet NaN (sign | 0x7e00) that the scalar returns;
//   f16 -> f32  F16C, then inf/NaN lanes rebuilt with integer ops (F16C quiets
//               signalling NaNs, the scalar keeps the payload as is);
//   bf16        AVX2 integer rounding, the same formula as the scalar; where the CPU
//               has AVX512_BF16, its vcvtne2ps2bf16 on the AVX-512 path (the same
//               bits: blocks holding a subnormal, which it flushes, take the integer
//               rounding).
// The AVX-512 path (chosen by active_isa()) repeats each on 16 lanes; the scalar path is the
// scalar functions alone.
// Buffers above a size threshold are split into chunks across OpenMP threads.
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/vec_math.hpp"
#include "kernels/cpu/vec_math512.hpp"

#include "core/error.hpp"
#include "core/half.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

#include <immintrin.h>

namespace dsa::cpu {
namespace {

// Below this many elements one thread does the whole buffer.
constexpr std::int64_t parallel_threshold = std::int64_t{1} << 18;
constexpr std::int64_t chunk_elements = std::int64_t{1} << 15;

// Calls fn(begin, end) over [0, n), in parallel chunks when n is large.
template <class Fn>
void for_chunks(std::int64_t n, Fn fn) {
  cpu::for_chunks(n, chunk_elements, parallel_threshold, fn);
}

// True when fn(begin, end) is true for some chunk of [0, n).
template <class Fn>
bool any_chunk(std::int64_t n, Fn fn) {
  if (n < parallel_threshold) return fn(std::int64_t{0}, n);
  const std::int64_t chunks = (n + chunk_elements - 1) / chunk_elements;
  bool found = false;
#pragma omp parallel for schedule(static) reduction(|| : found)
  for (std::int64_t i = 0; i < chunks; ++i) {
    const std::int64_t begin = i * chunk_elements;
    found = found || fn(begin, std::min(n, begin + chunk_elements));
  }
  return found;
}

// ---- AVX-512 forms ---------------------------------------------------------
// The AVX2 forms' operations on 16 (bf16/f32) or 32 (inf/nan of halves) lanes. Each converts
// the leading whole vectors of its span and returns how many elements it did; the caller
// finishes the tail with the scalar functions.
DSA_AVX512_CODE_BEGIN

DSA_AVX512_TARGET std::int64_t f32_to_half_avx512(std::uint16_t* out, const float* in, std::int64_t n, bool bf16) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) vec512::store_half16(out + i, _mm512_loadu_ps(in + i), bf16);
  return i;
}

// f32 -> bf16 with AVX512_BF16's vcvtne2ps2bf16: 32 floats rounded to nearest even in one
// instruction, NaNs quieted as the scalar quiets them (the high half with bit 6 set). It
// flushes subnormal inputs to zero, so a pair of vectors holding one takes the integer
// rounding instead (subnormals are rare in activations; zeros, as dropout makes, are not
// subnormal). Called only where the CPU has AVX512_BF16.

// Lanes whose magnitude is in [1, 0x007fffff]: the subnormals.
DSA_AVX512_BF16_TARGET inline __mmask16 subnormal_lanes(__m512 x) {
  const __m512i m = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
  return _mm512_cmple_epu32_mask(_mm512_sub_epi32(m, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x007ffffe));
}

DSA_AVX512_BF16_TARGET std::int64_t f32_to_bf16_avx512bf16(std::uint16_t* out, const float* in, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 lo = _mm512_loadu_ps(in + i), hi = _mm512_loadu_ps(in + i + 16);
    if ((subnormal_lanes(lo) | subnormal_lanes(hi)) != 0) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), vec512::f32_to_bf16_16(lo));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 16), vec512::f32_to_bf16_16(hi));
      continue;
    }
    const __m512bh both = _mm512_cvtne2ps_pbh(hi, lo); // lo's lanes first
    _mm512_storeu_si512(out + i, (__m512i)both);
  }
  return i;
}

DSA_AVX512_TARGET std::int64_t f16_to_f32_avx512(float* out, const std::uint16_t* in, std::int64_t n) {
  std::int64_t i = 0;
  const __m512i exp_mask = _mm512_set1_epi32(0x7c00);
  const __m512i sign_mask = _mm512_set1_epi32(0x8000);
  const __m512i mant_mask = _mm512_set1_epi32(0x3ff);
  const __m512i f32_inf = _mm512_set1_epi32(0x7f800000);
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    const __m512i converted = _mm512_castps_si512(_mm512_cvtph_ps(h));
    const __m512i h32 = _mm512_cvtepu16_epi32(h);
    const __mmask16 special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(h32, exp_mask), exp_mask);
    const __m512i rebuilt =
        _mm512_or_si512(_mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(h32, sign_mask), 16), f32_inf),
                        _mm512_slli_epi32(_mm512_and_si512(h32, mant_mask), 13));
    _mm512_storeu_si512(out + i, _mm512_mask_blend_epi32(special, converted, rebuilt));
  }
  return i;
}

DSA_AVX512_TARGET std::int64_t bf16_to_f32_avx512(float* out, const std::uint16_t* in, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    _mm512_storeu_si512(out + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return i;
}

// Whether any of the leading whole vectors holds an all-ones exponent; *done says how many
// elements were looked at.
DSA_AVX512_TARGET bool f32_inf_or_nan_avx512(const float* in, std::int64_t n, std::int64_t* done) {
  std::int64_t i = 0;
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  __mmask16 hit = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(in + i);
    hit = static_cast<__mmask16>(hit | _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, exp_mask), exp_mask));
  }
  *done = i;
  return hit != 0;
}

DSA_AVX512_TARGET bool half_inf_or_nan_avx512(const std::uint16_t* in, std::int64_t n, std::uint16_t exp_bits,
                                               std::int64_t* done) {
  std::int64_t i = 0;
  const __m512i exp_mask = _mm512_set1_epi16(static_cast<short>(exp_bits));
  __mmask32 hit = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i h = _mm512_loadu_si512(in + i);
    hit |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, exp_mask), exp_mask);
  }
  *done = i;
  return hit != 0;
}

DSA_AVX512_CODE_END

// -1: as the CPU has AVX512_BF16; else 0 or 1 as use_bf16_conversion_instructions set it.
std::atomic<int> bf16_instructions{-1};

} // namespace

bool bf16_conversion_instructions() {
  const int v = bf16_instructions.load(std::memory_order_relaxed);
  return v < 0 ? cpu_has_avx512_bf16() : v == 1;
}

void use_bf16_conversion_instructions(bool on) {
  DSA_CHECK(!on || cpu_has_avx512_bf16(), "use_bf16_conversion_instructions: no AVX512_BF16 ({})",
            best_isa() != hardware_isa() ? "DSA_CPU_ISA hides it" : "this CPU has none");
  bf16_instructions.store(on ? 1 : 0, std::memory_order_relaxed);
}

namespace {

// ---- f32 <-> f16 ----------------------------------------------------------

void f32_to_f16_span(isa path, std::uint16_t* out, const float* in, std::int64_t n) {
  std::int64_t i = 0;
  if (path == isa::avx512) i = f32_to_half_avx512(out, in, n, false);
#if DSA_VEC_MATH_AVX2
  if (path == isa::avx2)
    for (; i + 8 <= n; i += 8) vec::store_half8(out + i, _mm256_loadu_ps(in + i), false);
#endif
  for (; i < n; ++i) out[i] = f32_to_f16(in[i]);
}

void f16_to_f32_span(isa path, float* out, const std::uint16_t* in, std::int64_t n) {
  std::int64_t i = 0;
  if (path == isa::avx512) i = f16_to_f32_avx512(out, in, n);
#if defined(__F16C__) && defined(__AVX2__)
  if (path == isa::avx2) {
    const __m256i exp_mask = _mm256_set1_epi32(0x7c00);
    const __m256i sign_mask = _mm256_set1_epi32(0x8000);
    const __m256i mant_mask = _mm256_set1_epi32(0x3ff);
    const __m256i f32_inf = _mm256_set1_epi32(0x7f800000);
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
      const __m256i converted = _mm256_castps_si256(_mm256_cvtph_ps(h));
      // exp == 31: sign | inf | mant << 13, payload kept bit for bit.
      const __m256i h32 = _mm256_cvtepu16_epi32(h);
      const __m256i special = _mm256_cmpeq_epi32(_mm256_and_si256(h32, exp_mask), exp_mask);
      const __m256i rebuilt =
          _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(h32, sign_mask), 16), f32_inf),
                          _mm256_slli_epi32(_mm256_and_si256(h32, mant_mask), 13));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_blendv_epi8(converted, rebuilt, special));
    }
  }
#endif
  for (; i < n; ++i) out[i] = f16_to_f32(in[i]);
}

// ---- f32 <-> bf16 ---------------------------------------------------------

void f32_to_bf16_span(isa path, std::uint16_t* out, const float* in, std::int64_t n) {
  std::int64_t i = 0;
  if (path == isa::avx512 && bf16_conversion_instructions()) i = f32_to_bf16_avx512bf16(out, in, n);
  if (path == isa::avx512) i += f32_to_half_avx512(out + i, in + i, n - i, true);
#if DSA_VEC_MATH_AVX2
  if (path == isa::avx2)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), vec::f32_to_bf16_8(_mm256_loadu_ps(in + i)));
#endif
  for (; i < n; ++i) out[i] = f32_to_bf16(in[i]);
}

void bf16_to_f32_span(isa path, float* out, const std::uint16_t* in, std::int64_t n) {
  std::int64_t i = 0;
  if (path == isa::avx512) i = bf16_to_f32_avx512(out, in, n);
#if defined(__AVX2__)
  if (path == isa::avx2)
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
#endif
  for (; i < n; ++i) out[i] = bf16_to_f32(in[i]);
}

// ---- inf / nan ------------------------------------------------------------

bool f32_has_inf_or_nan(isa path, const float* in, std::int64_t n) {
  std::int64_t i = 0;
  if (path == isa::avx512 && f32_inf_or_nan_avx512(in, n, &i)) return true;
#if defined(__AVX2__)
  if (path == isa::avx2) {
    const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
    __m256i hit = _mm256_setzero_si256();
    for (; i + 8 <= n; i += 8) {
      const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
      hit = _mm256_or_si256(hit, _mm256_cmpeq_epi32(_mm256_and_si256(u, exp_mask), exp_mask));
    }
    if (!_mm256_testz_si256(hit, hit)) return true;
  }
#endif
  for (; i < n; ++i)
    if ((float_bits(in[i]) & 0x7f800000u) == 0x7f800000u) return true;
  return false;
}

// f16 and bf16 differ only in where the exponent lies.
bool half_has_inf_or_nan(isa path, const std::uint16_t* in, std::int64_t n, std::uint16_t exp_bits) {
  std::int64_t i = 0;
  if (path == isa::avx512 && half_inf_or_nan_avx512(in, n, exp_bits, &i)) return true;
#if defined(__AVX2__)
  if (path == isa::avx2) {
    const __m256i exp_mask = _mm256_set1_epi16(static_cast<short>(exp_bits));
    __m256i hit = _mm256_setzero_si256();
    for (; i + 16 <= n; i += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
      hit = _mm256_or_si256(hit, _mm256_cmpeq_epi16(_mm256_and_si256(h, exp_mask), exp_mask));
    }
    if (!_mm256_testz_si256(hit, hit)) return true;
  }
#endif
  for (; i < n; ++i)
    if ((in[i] & exp_bits) == exp_bits) return true;
  return false;
}

constexpr std::uint16_t f16_exp_bits = 0x7c00u;
constexpr std::uint16_t bf16_exp_bits = 0x7f80u;

void check_float_type(dtype t, const char* what) {
  DSA_CHECK(t == dtype::f32 || t == dtype::f16 || t == dtype::bf16, "{}: {} is not f32, f16 or bf16",
            what, dtype_name(t));
}

} // namespace

void cast_f32_to_f16(std::uint16_t* out, const float* in, std::int64_t n) {
  cast(out, dtype::f16, in, dtype::f32, n);
}

void cast_f16_to_f32(float* out, const std::uint16_t* in, std::int64_t n) {
  cast(out, dtype::f32, in, dtype::f16, n);
}

void cast_f32_to_bf16(std::uint16_t* out, const float* in, std::int64_t n) {
  cast(out, dtype::bf16, in, dtype::f32, n);
}

void cast_bf16_to_f32(float* out, const std::uint16_t* in, std::int64_t n) {
  cast(out, dtype::f32, in, dtype::bf16, n);
}

void cast(void* out, dtype out_type, const void* in, dtype in_type, std::int64_t n) {
  cast(active_isa(), out, out_type, in, in_type, n);
}

void cast(isa path, void* out, dtype out_type, const void* in, dtype in_type, std::int64_t n) {
  check_float_type(out_type, "cast output");
  check_float_type(in_type, "cast input");
  check_path(path, "cast");
  DSA_CHECK(n >= 0, "cast: n = {}", n);
  if (out_type == in_type) {
    if (n > 0) std::memmove(out, in, static_cast<std::size_t>(n) * dtype_size(in_type));
    return;
  }
  auto* out16 = static_cast<std::uint16_t*>(out);
  const auto* in16 = static_cast<const std::uint16_t*>(in);
  auto* out32 = static_cast<float*>(out);
  const auto* in32 = static_cast<const float*>(in);
  for_chunks(n, [&](std::int64_t b, std::int64_t e) {
    if (in_type == dtype::f32) {
      if (out_type == dtype::f16) return f32_to_f16_span(path, out16 + b, in32 + b, e - b);
      return f32_to_bf16_span(path, out16 + b, in32 + b, e - b);
    }
    if (out_type == dtype::f32) {
      if (in_type == dtype::f16) return f16_to_f32_span(path, out32 + b, in16 + b, e - b);
      return bf16_to_f32_span(path, out32 + b, in16 + b, e - b);
    }
    // f16 <-> bf16 through f32 (exact widening, then one rounding), in stack-sized blocks.
    constexpr std::int64_t block = 512;
    float tmp[block];
    for (std::int64_t i = b; i < e; i += block) {
      const std::int64_t len = std::min(block, e - i);
      if (in_type == dtype::f16) {
        f16_to_f32_span(path, tmp, in16 + i, len);
        f32_to_bf16_span(path, out16 + i, tmp, len);
      } else {
        bf16_to_f32_span(path, tmp, in16 + i, len);
        f32_to_f16_span(path, out16 + i, tmp, len);
      }
    }
  });
}

bool has_inf_or_nan(const void* in, dtype in_type, std::int64_t n) {
  return has_inf_or_nan(active_isa(), in, in_type, n);
}

bool has_inf_or_nan(isa path, const void* in, dtype in_type, std::int64_t n) {
  check_float_type(in_type, "has_inf_or_nan");
  check_path(path, "has_inf_or_nan");
  DSA_CHECK(n >= 0, "has_inf_or_nan: n = {}", n);
  if (in_type == dtype::f32) {
    const auto* p = static_cast<const float*>(in);
    return any_chunk(n, [&](std::int64_t b, std::int64_t e) { return f32_has_inf_or_nan(path, p + b, e - b); });
  }
  const auto* p = static_cast<const std::uint16_t*>(in);
  const std::uint16_t exp_bits = in_type == dtype::f16 ? f16_exp_bits : bf16_exp_bits;
  return any_chunk(n, [&](std::int64_t b, std::int64_t e) { return half_has_inf_or_nan(path, p + b, e - b, exp_bits); });
}

} // namespace dsa::cpu
