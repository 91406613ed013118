// kernels/cpu/convert: the vector paths against core/half.hpp bit for bit,
// hand-picked rounding cases, and inf/nan detection.
#include "core/half.hpp"
#include "kernels/cpu/convert.hpp"
#include "tests/support/isa_paths.hpp"

#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using dsa::bits_float;
using dsa::dtype;
using dsa::float_bits;

bool f16_is_nan(std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

// Specials that every bit-for-bit comparison includes.
std::vector<std::uint32_t> special_f32_bits() {
  return {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u,
          0xffa5a5a5u, 0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x807fffffu, 0x3f800000u, 0x477fe000u,
          0x477ff000u, 0x477fefffu, 0x38800000u, 0x387fffffu, 0x33800000u, 0x33000000u, 0x3f808000u,
          0x3f818000u, 0x3f800fffu, 0x3f801000u, 0x3f803000u, 0xc77ff000u};
}

// Random bit patterns (all classes, NaN payloads included) mixed with values in the f16 range.
std::vector<float> mixed_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> exponent(-26.0f, 17.0f);
  std::vector<float> out(n);
  const auto specials = special_f32_bits();
  for (std::size_t i = 0; i < n; ++i) {
    switch (rng() % 3) {
    case 0: out[i] = bits_float(static_cast<std::uint32_t>(rng())); break;
    case 1: out[i] = (rng() & 1 ? -1.0f : 1.0f) * std::exp2(exponent(rng)); break;
    default: out[i] = bits_float(specials[rng() % specials.size()]); break;
    }
  }
  return out;
}

std::vector<std::uint16_t> random_halves(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint16_t> out(n);
  for (auto& h : out) h = static_cast<std::uint16_t>(rng());
  // Specials of both formats: zeros, infs, NaNs with and without the quiet bit, subnormals.
  const std::uint16_t specials[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7c01, 0x7e00, 0xfdff, 0x0001,
                                    0x03ff, 0x7f80, 0xff80, 0x7f81, 0x7fc0, 0x0080, 0x007f, 0x7bff};
  for (std::size_t i = 0; i < n && i < sizeof(specials) / sizeof(specials[0]); ++i) out[i * 2 % n] = specials[i];
  return out;
}

struct rounding_case {
  float in;
  std::uint16_t out;
  const char* what;
};

void check_cases(const std::vector<rounding_case>& cases, dtype half_type) {
  // Scalar spec, then the kernel with the cases both in the vector body and in the tail.
  std::vector<float> in;
  for (const auto& c : cases) in.push_back(c.in);
  for (int copies = 0; copies < 3; ++copies)
    for (const auto& c : cases) in.push_back(c.in);
  std::vector<std::uint16_t> out(in.size());
  dsa::cpu::cast(out.data(), half_type, in.data(), dtype::f32, static_cast<std::int64_t>(in.size()));
  for (std::size_t i = 0; i < in.size(); ++i) {
    const auto& c = cases[i % cases.size()];
    const std::uint16_t scalar = half_type == dtype::f16 ? dsa::f32_to_f16(c.in) : dsa::f32_to_bf16(c.in);
    INFO(std::string(c.what) << " index " << i);
    CHECK(scalar == c.out);
    CHECK(out[i] == c.out);
  }
}

// Element i of a byte buffer of type t, as raw bits.
std::uint32_t load_bits(const std::vector<unsigned char>& buf, dtype t, std::int64_t i) {
  if (t == dtype::f32) {
    std::uint32_t u;
    std::memcpy(&u, buf.data() + i * 4, 4);
    return u;
  }
  std::uint16_t h;
  std::memcpy(&h, buf.data() + i * 2, 2);
  return h;
}

void store_bits(std::vector<unsigned char>& buf, dtype t, std::int64_t i, std::uint32_t bits) {
  if (t == dtype::f32) {
    std::memcpy(buf.data() + i * 4, &bits, 4);
    return;
  }
  const auto h = static_cast<std::uint16_t>(bits);
  std::memcpy(buf.data() + i * 2, &h, 2);
}

// Scalar model of cast: widen exactly to f32, round once to the output type.
float widen(std::uint32_t bits, dtype t) {
  if (t == dtype::f32) return bits_float(bits);
  const auto h = static_cast<std::uint16_t>(bits);
  return t == dtype::f16 ? dsa::f16_to_f32(h) : dsa::bf16_to_f32(h);
}

std::uint32_t round_to(float f, dtype t) {
  if (t == dtype::f32) return float_bits(f);
  return t == dtype::f16 ? dsa::f32_to_f16(f) : dsa::f32_to_bf16(f);
}

} // namespace

TEST_CASE("convert: every f16 bit pattern widens like core/half.hpp and round-trips") {
  // 8 copies of all 65536 patterns, so the threaded chunked path runs as well as the plain one.
  constexpr std::int64_t patterns = 65536;
  for (std::int64_t copies : {std::int64_t{1}, std::int64_t{8}}) {
    const std::int64_t n = patterns * copies;
    std::vector<std::uint16_t> h(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) h[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(i);
    std::vector<float> f(h.size());
    std::vector<std::uint16_t> back(h.size());
    dsa::cpu::cast_f16_to_f32(f.data(), h.data(), n);
    dsa::cpu::cast_f32_to_f16(back.data(), f.data(), n);
    std::int64_t widen_mismatch = 0, roundtrip_mismatch = 0;
    for (std::size_t i = 0; i < h.size(); ++i) {
      if (float_bits(f[i]) != float_bits(dsa::f16_to_f32(h[i]))) ++widen_mismatch;
      if (f16_is_nan(h[i])) {
        // NaN stays NaN, with its sign, as the canonical quiet NaN of the scalar.
        if (back[i] != ((h[i] & 0x8000u) | 0x7e00u)) ++roundtrip_mismatch;
      } else if (back[i] != h[i]) {
        ++roundtrip_mismatch;
      }
    }
    INFO("copies " << copies);
    CHECK(widen_mismatch == 0);
    CHECK(roundtrip_mismatch == 0);
  }
}

TEST_CASE("convert: f32 -> f16 rounds to nearest even, overflows to inf, keeps subnormals") {
  const float one = 1.0f;
  check_cases(
      {
          {one + std::ldexp(1.0f, -11), 0x3c00, "1 + 2^-11: tie, even is down"},
          {one + 3 * std::ldexp(1.0f, -11), 0x3c02, "1 + 3*2^-11: tie, even is up"},
          {one + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20), 0x3c01, "just above the tie"},
          {-(one + 3 * std::ldexp(1.0f, -11)), 0xbc02, "negative tie"},
          {65504.0f, 0x7bff, "max finite"},
          {65519.0f, 0x7bff, "65519 -> 65504"},
          {65520.0f, 0x7c00, "65520 -> inf"},
          {-65520.0f, 0xfc00, "-65520 -> -inf"},
          {1e10f, 0x7c00, "far overflow"},
          {INFINITY, 0x7c00, "inf"},
          {-INFINITY, 0xfc00, "-inf"},
          {0.0f, 0x0000, "zero"},
          {-0.0f, 0x8000, "negative zero"},
          {std::ldexp(1.0f, -24), 0x0001, "smallest subnormal"},
          {std::ldexp(1.0f, -25), 0x0000, "half the smallest subnormal: tie to 0"},
          {3 * std::ldexp(1.0f, -25), 0x0002, "1.5 units: tie to 2"},
          {std::ldexp(1.0f, -25) + std::ldexp(1.0f, -40), 0x0001, "just above half a unit"},
          {1023 * std::ldexp(1.0f, -24), 0x03ff, "largest subnormal"},
          {1023.5f * std::ldexp(1.0f, -24), 0x0400, "tie between largest subnormal and min normal"},
          {std::ldexp(1.0f, -14), 0x0400, "min normal"},
          {-std::ldexp(1.0f, -24), 0x8001, "negative subnormal"},
          {1e-40f, 0x0000, "f32 subnormal underflows"},
          {bits_float(0x7fc00000u), 0x7e00, "quiet NaN"},
          {bits_float(0x7f800001u), 0x7e00, "signalling NaN stays NaN"},
          {bits_float(0xffc00123u), 0xfe00, "negative NaN keeps its sign"},
      },
      dtype::f16);
}

TEST_CASE("convert: f32 -> bf16 rounds to nearest even and keeps NaN") {
  const float one = 1.0f;
  check_cases(
      {
          {one + std::ldexp(1.0f, -8), 0x3f80, "1 + 2^-8: tie, even is down"},
          {one + 3 * std::ldexp(1.0f, -8), 0x3f82, "1 + 3*2^-8: tie, even is up"},
          {one + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20), 0x3f81, "just above the tie"},
          {-(one + 3 * std::ldexp(1.0f, -8)), 0xbf82, "negative tie"},
          {bits_float(0x7f7f0000u), 0x7f7f, "max finite bf16"},
          {FLT_MAX, 0x7f80, "f32 max rounds past the last bf16 midpoint to inf"},
          {INFINITY, 0x7f80, "inf"},
          {-INFINITY, 0xff80, "-inf"},
          {-0.0f, 0x8000, "negative zero"},
          {bits_float(0x00010000u), 0x0001, "subnormal kept"},
          {bits_float(0x00008000u), 0x0000, "subnormal tie to even zero"},
          {bits_float(0x7fc00000u), 0x7fc0, "quiet NaN"},
          {bits_float(0x7f800001u), 0x7fc0, "signalling NaN, low payload: quieted, not inf"},
          {bits_float(0x7fa00000u), 0x7fe0, "NaN payload kept in the top bits"},
          {bits_float(0xffffffffu), 0xffff, "all-ones NaN does not wrap"},
      },
      dtype::bf16);
}

TEST_CASE("convert: every vector path equals core/half.hpp bit for bit, lengths 1..40") {
  const auto floats = mixed_floats(41, 7);
  const auto halves = random_halves(41, 11);
  for (dsa::cpu::isa path : dsa::test::isa_paths()) {
    for (std::int64_t n = 1; n <= 40; ++n) {
      for (std::int64_t offset : {0, 1}) { // unaligned starts too
        INFO(dsa::cpu::isa_name(path) << " n " << n << " offset " << offset);
        const float* in32 = floats.data() + offset;
        const std::uint16_t* in16 = halves.data() + offset;
        std::vector<std::uint16_t> f16(static_cast<std::size_t>(n)), bf16(static_cast<std::size_t>(n));
        std::vector<float> from_f16(static_cast<std::size_t>(n)), from_bf16(static_cast<std::size_t>(n));
        dsa::cpu::cast(path, f16.data(), dtype::f16, in32, dtype::f32, n);
        dsa::cpu::cast(path, bf16.data(), dtype::bf16, in32, dtype::f32, n);
        dsa::cpu::cast(path, from_f16.data(), dtype::f32, in16, dtype::f16, n);
        dsa::cpu::cast(path, from_bf16.data(), dtype::f32, in16, dtype::bf16, n);
        int mismatches = 0;
        for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
          mismatches += f16[i] != dsa::f32_to_f16(in32[i]);
          mismatches += bf16[i] != dsa::f32_to_bf16(in32[i]);
          mismatches += float_bits(from_f16[i]) != float_bits(dsa::f16_to_f32(in16[i]));
          mismatches += float_bits(from_bf16[i]) != float_bits(dsa::bf16_to_f32(in16[i]));
        }
        CHECK(mismatches == 0);
      }
    }
  }
}

TEST_CASE("convert: large random buffers (threaded path) equal the scalar on every path") {
  const std::size_t n = (std::size_t{1} << 19) + 37;
  const auto floats = mixed_floats(n, 3);
  const auto halves = random_halves(n, 5);
  for (dsa::cpu::isa path : dsa::test::isa_paths()) {
    INFO(dsa::cpu::isa_name(path));
    std::vector<std::uint16_t> f16(n), bf16(n);
    std::vector<float> from_f16(n), from_bf16(n);
    dsa::cpu::cast(path, f16.data(), dtype::f16, floats.data(), dtype::f32, static_cast<std::int64_t>(n));
    dsa::cpu::cast(path, bf16.data(), dtype::bf16, floats.data(), dtype::f32, static_cast<std::int64_t>(n));
    dsa::cpu::cast(path, from_f16.data(), dtype::f32, halves.data(), dtype::f16, static_cast<std::int64_t>(n));
    dsa::cpu::cast(path, from_bf16.data(), dtype::f32, halves.data(), dtype::bf16, static_cast<std::int64_t>(n));
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < n; ++i) {
      mismatches += f16[i] != dsa::f32_to_f16(floats[i]);
      mismatches += bf16[i] != dsa::f32_to_bf16(floats[i]);
      mismatches += float_bits(from_f16[i]) != float_bits(dsa::f16_to_f32(halves[i]));
      mismatches += float_bits(from_bf16[i]) != float_bits(dsa::bf16_to_f32(halves[i]));
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("convert: AVX512_BF16's rounding instruction gives the integer rounding's bits") {
  if (!dsa::cpu::cpu_has_avx512_bf16()) {
    CHECK(!dsa::cpu::bf16_conversion_instructions()); // the integer rounding is the only one
    return dsa::test::skip_for_cpu("AVX512_BF16");
  }
  // Each block of 32 holds one subnormal at a moving lane (the instruction flushes those, so
  // its block must take the integer rounding), then blocks of normal values, ties, zeros
  // and NaN payloads only; random bit patterns of every class after them.
  std::vector<float> in;
  for (int lane = 0; lane < 32; ++lane)
    for (int j = 0; j < 32; ++j)
      in.push_back(j == lane ? bits_float(0x00008001u + static_cast<std::uint32_t>(lane) * 0x00040001u)
                             : 1.0f + static_cast<float>(j) * std::ldexp(1.0f, -8));
  const std::uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x7fa00000u, 0xffffffffu, 0x7f800001u,
                                    0x00000000u, 0x80000000u, 0x7f7fffffu, 0xff800000u, 0x80800000u};
  for (int j = 0; j < 64; ++j) in.push_back(bits_float(specials[j % 10]));
  const auto random = mixed_floats(4099, 13);
  in.insert(in.end(), random.begin(), random.end());
  const auto n = static_cast<std::int64_t>(in.size());
  std::vector<std::uint16_t> with(in.size()), without(in.size());
  dsa::cpu::cast(dsa::cpu::isa::avx512, with.data(), dtype::bf16, in.data(), dtype::f32, n);
  dsa::cpu::use_bf16_conversion_instructions(false);
  dsa::cpu::cast(dsa::cpu::isa::avx512, without.data(), dtype::bf16, in.data(), dtype::f32, n);
  dsa::cpu::use_bf16_conversion_instructions(true); // as it was: the CPU has it
  int mismatches = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::uint16_t scalar = dsa::f32_to_bf16(in[i]);
    if (with[i] != scalar || without[i] != scalar) {
      if (++mismatches <= 5)
        MESSAGE("element " << i << " bits " << float_bits(in[i]) << ": " << with[i] << " / " << without[i] << " want "
                           << scalar);
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("convert: cast dispatches every pair of float types") {
  const dtype types[] = {dtype::f32, dtype::f16, dtype::bf16};
  const std::int64_t n = 37;
  const auto floats = mixed_floats(static_cast<std::size_t>(n), 5);
  for (dtype in_type : types) {
    // Inputs of in_type made from the same floats.
    std::vector<unsigned char> in(static_cast<std::size_t>(n) * 4);
    dsa::cpu::cast(in.data(), in_type, floats.data(), dtype::f32, n);
    for (dtype out_type : types) {
      INFO(std::string(dsa::dtype_name(in_type)) << " -> " << std::string(dsa::dtype_name(out_type)));
      for (dsa::cpu::isa path : dsa::test::isa_paths()) {
        INFO(dsa::cpu::isa_name(path));
        std::vector<unsigned char> out(static_cast<std::size_t>(n) * 4);
        dsa::cpu::cast(path, out.data(), out_type, in.data(), in_type, n);
        int mismatches = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          const std::uint32_t in_bits = load_bits(in, in_type, i);
          // Same type is a copy; otherwise widen exactly to f32 and round once.
          const std::uint32_t expected =
              in_type == out_type ? in_bits : round_to(widen(in_bits, in_type), out_type);
          mismatches += load_bits(out, out_type, i) != expected;
        }
        CHECK(mismatches == 0);
      }
    }
  }
}

TEST_CASE("convert: has_inf_or_nan finds inf/nan anywhere and passes finite extremes") {
  struct kind {
    dtype type;
    std::uint32_t one, max_finite, inf, nan, sign;
  };
  const kind kinds[] = {
      {dtype::f32, 0x3f800000u, 0x7f7fffffu, 0x7f800000u, 0x7fc00001u, 0x80000000u},
      {dtype::f16, 0x3c00u, 0x7bffu, 0x7c00u, 0x7c01u, 0x8000u},
      {dtype::bf16, 0x3f80u, 0x7f7fu, 0x7f80u, 0x7fc1u, 0x8000u},
  };
  const std::int64_t lengths[] = {1, 37, 131, (std::int64_t{1} << 18) + 37};
  for (const auto& k : kinds) {
    // Finite data: max finite of both signs, the smallest subnormal, zero and +-1.
    const std::uint32_t pattern[] = {k.max_finite, k.max_finite | k.sign, 1u, 0u, k.one, k.one | k.sign};
    for (std::int64_t n : lengths) {
      std::vector<unsigned char> buf(static_cast<std::size_t>(n) * dsa::dtype_size(k.type));
      for (std::int64_t i = 0; i < n; ++i) store_bits(buf, k.type, i, pattern[i % 6]);
      INFO(std::string(dsa::dtype_name(k.type)) << " n " << n);
      for (dsa::cpu::isa path : dsa::test::isa_paths()) {
        INFO(dsa::cpu::isa_name(path));
        CHECK_FALSE(dsa::cpu::has_inf_or_nan(path, buf.data(), k.type, n));
        for (std::int64_t pos : {std::int64_t{0}, n / 2, n - 1}) {
          for (std::uint32_t bad : {k.inf, k.inf | k.sign, k.nan, k.nan | k.sign}) {
            store_bits(buf, k.type, pos, bad);
            INFO("position " << pos << " bits " << bad);
            CHECK(dsa::cpu::has_inf_or_nan(path, buf.data(), k.type, n));
            store_bits(buf, k.type, pos, pattern[pos % 6]);
          }
        }
      }
    }
  }
  CHECK_FALSE(dsa::cpu::has_inf_or_nan(nullptr, dtype::f16, 0));
}
