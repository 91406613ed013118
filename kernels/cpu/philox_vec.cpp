// Philox words for many blocks; see philox_vec.hpp. Lanes are blocks: counter word 0 is the
// block number, words 1-3 and the key are the stream's, the same in every lane.
#include "kernels/cpu/philox_vec.hpp"

#include "core/error.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dsa::cpu {
namespace {

constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;

void words_scalar(const philox_stream& s, std::uint32_t first, std::int64_t blocks, std::uint32_t* out) {
  for (std::int64_t b = 0; b < blocks; ++b) {
    const philox_counter r = philox4x32(s.counter(first + static_cast<std::uint32_t>(b)), s.key());
    for (int k = 0; k < 4; ++k) out[4 * b + k] = r[static_cast<std::size_t>(k)];
  }
}

#if defined(__x86_64__)
// High halves of the 32x32-bit products of every lane: even lanes from one widening
// multiply, odd lanes from another on the shifted operands.
__attribute__((target("avx2"))) __m256i mulhi_avx2(__m256i a, __m256i m) {
  const __m256i even = _mm256_srli_epi64(_mm256_mul_epu32(a, m), 32);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), _mm256_srli_epi64(m, 32));
  return _mm256_blend_epi32(even, odd, 0xAA);
}

__attribute__((target("avx2"))) void words_avx2(const philox_stream& s, std::uint32_t first, std::int64_t blocks,
                                                std::uint32_t* out) {
  const philox_counter c0 = s.counter(first);
  const philox_key k0 = s.key();
  const __m256i mul0 = _mm256_set1_epi32(static_cast<int>(m0)), mul1 = _mm256_set1_epi32(static_cast<int>(m1));
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  std::int64_t b = 0;
  for (; b + 8 <= blocks; b += 8) {
    __m256i x0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(c0[0] + static_cast<std::uint32_t>(b))), lane);
    __m256i x1 = _mm256_set1_epi32(static_cast<int>(c0[1]));
    __m256i x2 = _mm256_set1_epi32(static_cast<int>(c0[2]));
    __m256i x3 = _mm256_set1_epi32(static_cast<int>(c0[3]));
    std::uint32_t ka = k0[0], kb = k0[1];
    for (int round = 0; round < 10; ++round) {
      const __m256i hi0 = mulhi_avx2(x0, mul0), lo0 = _mm256_mullo_epi32(x0, mul0);
      const __m256i hi1 = mulhi_avx2(x2, mul1), lo1 = _mm256_mullo_epi32(x2, mul1);
      x0 = _mm256_xor_si256(_mm256_xor_si256(hi1, x1), _mm256_set1_epi32(static_cast<int>(ka)));
      x1 = lo1;
      x2 = _mm256_xor_si256(_mm256_xor_si256(hi0, x3), _mm256_set1_epi32(static_cast<int>(kb)));
      x3 = lo0;
      ka += w0;
      kb += w1;
    }
    // Word k of block l is lane l of x_k: interleave within 128-bit halves (blocks l and l + 4
    // share a register), then pair the halves so each output vector holds two whole blocks.
    const __m256i t0 = _mm256_unpacklo_epi32(x0, x1), t1 = _mm256_unpackhi_epi32(x0, x1);
    const __m256i t2 = _mm256_unpacklo_epi32(x2, x3), t3 = _mm256_unpackhi_epi32(x2, x3);
    const __m256i v0 = _mm256_unpacklo_epi64(t0, t2), v1 = _mm256_unpackhi_epi64(t0, t2); // blocks 0|4, 1|5
    const __m256i v2 = _mm256_unpacklo_epi64(t1, t3), v3 = _mm256_unpackhi_epi64(t1, t3); // blocks 2|6, 3|7
    auto* o = reinterpret_cast<__m256i*>(out + 4 * b);
    _mm256_storeu_si256(o, _mm256_permute2x128_si256(v0, v1, 0x20));
    _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(v2, v3, 0x20));
    _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(v0, v1, 0x31));
    _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(v2, v3, 0x31));
  }
  words_scalar(s, first + static_cast<std::uint32_t>(b), blocks - b, out + 4 * b);
}

DSA_AVX512_CODE_BEGIN
DSA_AVX512_TARGET __m512i mulhi_avx512(__m512i a, __m512i m) {
  const __m512i even = _mm512_srli_epi64(_mm512_mul_epu32(a, m), 32);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), _mm512_srli_epi64(m, 32));
  return _mm512_mask_blend_epi32(0xAAAA, even, odd);
}

// Philox rounds for `G` independent sets of 16 blocks at once: one set's rounds are a chain
// of dependent multiplies, so interleaving sets fills the multiplier's latency. (GCC 12 reports
// the intrinsics' undefined merge operands as uninitialized once inlined over the arrays.)
#pragma GCC diagnostic ignored "-Wuninitialized"
template <int G>
DSA_AVX512_TARGET inline void rounds_avx512(const philox_counter& c0, const philox_key& k0, std::int64_t b,
                                            std::uint32_t* out) {
  const __m512i mul0 = _mm512_set1_epi32(static_cast<int>(m0)), mul1 = _mm512_set1_epi32(static_cast<int>(m1));
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i x0[G], x1[G], x2[G], x3[G];
  for (int g = 0; g < G; ++g) {
    x0[g] = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(c0[0] + static_cast<std::uint32_t>(b + 16 * g))), lane);
    x1[g] = _mm512_set1_epi32(static_cast<int>(c0[1]));
    x2[g] = _mm512_set1_epi32(static_cast<int>(c0[2]));
    x3[g] = _mm512_set1_epi32(static_cast<int>(c0[3]));
  }
  std::uint32_t ka = k0[0], kb = k0[1];
  for (int round = 0; round < 10; ++round) {
    const __m512i key_a = _mm512_set1_epi32(static_cast<int>(ka)), key_b = _mm512_set1_epi32(static_cast<int>(kb));
    for (int g = 0; g < G; ++g) {
      const __m512i hi0 = mulhi_avx512(x0[g], mul0), lo0 = _mm512_mullo_epi32(x0[g], mul0);
      const __m512i hi1 = mulhi_avx512(x2[g], mul1), lo1 = _mm512_mullo_epi32(x2[g], mul1);
      x0[g] = _mm512_xor_si512(_mm512_xor_si512(hi1, x1[g]), key_a);
      x1[g] = lo1;
      x2[g] = _mm512_xor_si512(_mm512_xor_si512(hi0, x3[g]), key_b);
      x3[g] = lo0;
    }
    ka += w0;
    kb += w1;
  }
  for (int g = 0; g < G; ++g) {
    // Word k of block l is lane l of x_k. 4x4 transposes of 32-bit words inside each 128-bit
    // group: u0 then holds blocks 0, 4, 8, 12 (one per group), u1 blocks 1, 5, 9, 13, ...
    const __m512i t0 = _mm512_unpacklo_epi32(x0[g], x1[g]), t1 = _mm512_unpackhi_epi32(x0[g], x1[g]);
    const __m512i t2 = _mm512_unpacklo_epi32(x2[g], x3[g]), t3 = _mm512_unpackhi_epi32(x2[g], x3[g]);
    const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
    const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
    // ... and a 4x4 transpose of the 128-bit groups puts blocks 4v..4v+3 in output vector v.
    const __m512i low01 = _mm512_shuffle_i32x4(u0, u1, 0x44), low23 = _mm512_shuffle_i32x4(u2, u3, 0x44);
    const __m512i high01 = _mm512_shuffle_i32x4(u0, u1, 0xee), high23 = _mm512_shuffle_i32x4(u2, u3, 0xee);
    std::uint32_t* o = out + 4 * (b + 16 * g);
    _mm512_storeu_si512(o, _mm512_shuffle_i32x4(low01, low23, 0x88));
    _mm512_storeu_si512(o + 16, _mm512_shuffle_i32x4(low01, low23, 0xdd));
    _mm512_storeu_si512(o + 32, _mm512_shuffle_i32x4(high01, high23, 0x88));
    _mm512_storeu_si512(o + 48, _mm512_shuffle_i32x4(high01, high23, 0xdd));
  }
}

DSA_AVX512_TARGET void words_avx512(const philox_stream& s, std::uint32_t first, std::int64_t blocks,
                                    std::uint32_t* out) {
  const philox_counter c0 = s.counter(first);
  const philox_key k0 = s.key();
  std::int64_t b = 0;
  for (; b + 32 <= blocks; b += 32) rounds_avx512<2>(c0, k0, b, out);
  for (; b + 16 <= blocks; b += 16) rounds_avx512<1>(c0, k0, b, out);
  words_avx2(s, first + static_cast<std::uint32_t>(b), blocks - b, out + 4 * b);
}
DSA_AVX512_CODE_END
#endif

} // namespace

void philox_words(isa path, const philox_stream& stream, std::uint32_t first, std::int64_t blocks,
                  std::uint32_t* out) {
  DSA_CHECK(blocks >= 0, "philox_words: {} blocks", blocks);
  check_path(path, "philox_words");
#if defined(__x86_64__)
  if (path == isa::avx512) return words_avx512(stream, first, blocks, out);
  if (path == isa::avx2) return words_avx2(stream, first, blocks, out);
#endif
  words_scalar(stream, first, blocks, out);
}

void philox_words(const philox_stream& stream, std::uint32_t first, std::int64_t blocks, std::uint32_t* out) {
  philox_words(active_isa(), stream, first, blocks, out);
}

} // namespace dsa::cpu
