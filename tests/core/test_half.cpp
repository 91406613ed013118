// Scalar fp16/bf16 conversion: exhaustive round trips and rounding ties.
#include "core/half.hpp"

#include <doctest/doctest.h>

#include <cmath>

using namespace dsa;

TEST_CASE("every finite f16 value round-trips exactly through f32") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    std::uint16_t bits = static_cast<std::uint16_t>(h);
    float f = f16_to_f32(bits);
    if (std::isnan(f)) {
      CHECK(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    REQUIRE(f32_to_f16(f) == bits);
  }
}

TEST_CASE("f16 rounds to nearest even, overflows to inf, keeps subnormals") {
  CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == f32_to_f16(1.0f));          // tie -> even (down)
  CHECK(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == f32_to_f16(1.0f) + 2);  // tie -> even (up)
  CHECK(f16_to_f32(f32_to_f16(65519.0f)) == 65504.0f);
  CHECK(f32_to_f16(65520.0f) == 0x7c00u);
  CHECK(f32_to_f16(-1e10f) == 0xfc00u);
  CHECK(f32_to_f16(std::ldexp(1.0f, -24)) == 1u);        // smallest subnormal
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0u);        // tie between 0 and 2^-24 -> even (0)
  CHECK(f32_to_f16(std::ldexp(3.0f, -26)) == 1u);        // 0.75 ulp rounds up
  CHECK(f32_to_f16(std::ldexp(1.0f, -14)) == 0x0400u);   // smallest normal
}

TEST_CASE("bf16 rounds to nearest even and keeps NaN") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    REQUIRE(f32_to_bf16(f) == h);
  }
  CHECK(f32_to_bf16(bits_float(0x3f808000u)) == 0x3f80u); // tie -> even (down)
  CHECK(f32_to_bf16(bits_float(0x3f818000u)) == 0x3f82u); // tie -> even (up)
  CHECK(f32_to_bf16(bits_float(0x3f808001u)) == 0x3f81u); // above tie
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  CHECK(f32_to_bf16(bits_float(0x7f7fffffu)) == 0x7f80u); // max float rounds to inf
}
