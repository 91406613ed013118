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
  alignas(32) std::uint32_t r[4][8];
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
    _mm256_store_si256(reinterpret_cast<__m256i*>(r[0]), x0);
    _mm256_store_si256(reinterpret_cast<__m256i*>(r[1]), x1);
    _mm256_store_si256(reinterpret_cast<__m256i*>(r[2]), x2);
    _mm256_store_si256(reinterpret_cast<__m256i*>(r[3]), x3);
    for (int l = 0; l < 8; ++l)
      for (int k = 0; k < 4; ++k) out[4 * (b + l) + k] = r[k][l];
  }
  words_scalar(s, first + static_cast<std::uint32_t>(b), blocks - b, out + 4 * b);
}

DSA_AVX512_CODE_BEGIN
DSA_AVX512_TARGET __m512i mulhi_avx512(__m512i a, __m512i m) {
  const __m512i even = _mm512_srli_epi64(_mm512_mul_epu32(a, m), 32);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), _mm512_srli_epi64(m, 32));
  return _mm512_mask_blend_epi32(0xAAAA, even, odd);
}

DSA_AVX512_TARGET void words_avx512(const philox_stream& s, std::uint32_t first, std::int64_t blocks,
                                    std::uint32_t* out) {
  const philox_counter c0 = s.counter(first);
  const philox_key k0 = s.key();
  const __m512i mul0 = _mm512_set1_epi32(static_cast<int>(m0)), mul1 = _mm512_set1_epi32(static_cast<int>(m1));
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  // Word k of the 16 blocks goes to out[4 l + k]: a scatter-free interleave through a
  // permutation table per output vector (four words of four blocks each).
  std::int64_t b = 0;
  for (; b + 16 <= blocks; b += 16) {
    __m512i x0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(c0[0] + static_cast<std::uint32_t>(b))), lane);
    __m512i x1 = _mm512_set1_epi32(static_cast<int>(c0[1]));
    __m512i x2 = _mm512_set1_epi32(static_cast<int>(c0[2]));
    __m512i x3 = _mm512_set1_epi32(static_cast<int>(c0[3]));
    std::uint32_t ka = k0[0], kb = k0[1];
    for (int round = 0; round < 10; ++round) {
      const __m512i hi0 = mulhi_avx512(x0, mul0), lo0 = _mm512_mullo_epi32(x0, mul0);
      const __m512i hi1 = mulhi_avx512(x2, mul1), lo1 = _mm512_mullo_epi32(x2, mul1);
      x0 = _mm512_xor_si512(_mm512_xor_si512(hi1, x1), _mm512_set1_epi32(static_cast<int>(ka)));
      x1 = lo1;
      x2 = _mm512_xor_si512(_mm512_xor_si512(hi0, x3), _mm512_set1_epi32(static_cast<int>(kb)));
      x3 = lo0;
      ka += w0;
      kb += w1;
    }
    // 4x4 transposes of 32-bit words inside each 128-bit group of four blocks.
    const __m512i t0 = _mm512_unpacklo_epi32(x0, x1), t1 = _mm512_unpackhi_epi32(x0, x1);
    const __m512i t2 = _mm512_unpacklo_epi32(x2, x3), t3 = _mm512_unpackhi_epi32(x2, x3);
    const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
    const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
    // u0 holds blocks 0, 4, 8, 12 (one per 128-bit group), u1 blocks 1, 5, 9, 13, ...
    alignas(64) std::uint32_t r[4][16];
    _mm512_store_si512(r[0], u0);
    _mm512_store_si512(r[1], u1);
    _mm512_store_si512(r[2], u2);
    _mm512_store_si512(r[3], u3);
    for (int g = 0; g < 4; ++g)
      for (int j = 0; j < 4; ++j)
        for (int k = 0; k < 4; ++k) out[4 * (b + 4 * g + j) + k] = r[j][4 * g + k];
  }
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
