// Scalar fp16 / bf16 <-> fp32 conversion with round-to-nearest-even.
// These are the reference semantics; kernels/cpu/convert vectorizes them.
#pragma once

#include <cstdint>
#include <cstring>

namespace dsa {

// Raw 16-bit storage types: distinct so overloads and dtype_of can tell them apart.
struct f16_bits { std::uint16_t bits; };
struct bf16_bits { std::uint16_t bits; };

inline std::uint32_t float_bits(float f) { std::uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(std::uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// bf16: the top 16 bits of fp32, rounded to nearest even; NaN stays a quiet NaN.
inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}
inline float bf16_to_f32(std::uint16_t h) { return bits_float(static_cast<std::uint32_t>(h) << 16); }

// IEEE binary16 from binary32, round to nearest even, overflow to inf, subnormals kept.
inline std::uint16_t f32_to_f16(float f) {
  std::uint32_t u = float_bits(f);
  std::uint32_t sign = (u >> 16) & 0x8000u;
  std::uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u); // NaN
  if (absu >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u); // >= 65520 rounds to inf
  if (absu < 0x38800000u) {                                                   // below 2^-14: subnormal
    // value = absu as float; scale to units of 2^-24 with RNE using float arithmetic.
    float a = bits_float(absu);
    float scaled = a * 16777216.0f; // exact: power of two
    // nearbyint under the default rounding mode is round-half-even.
    std::uint32_t q = static_cast<std::uint32_t>(__builtin_nearbyintf(scaled));
    return static_cast<std::uint16_t>(sign | q);
  }
  std::uint32_t mant_odd = (absu >> 13) & 1u;
  absu += 0xfffu + mant_odd;                  // round mantissa to 10 bits, ties to even
  absu -= (112u << 23);                       // rebias exponent 127 -> 15
  return static_cast<std::uint16_t>(sign | (absu >> 13));
}

inline float f16_to_f32(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f); // 2^-24 units
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

} // namespace dsa
