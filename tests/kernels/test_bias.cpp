// kernels/cpu/bias: bias_add against an exact loop, bias_backward against its
// double reference, at awkward and at threaded sizes.
#include "kernels/cpu/bias.hpp"
#include "kernels/cpu/convert.hpp"
#include "core/half.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/isa_paths.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

std::vector<float> random_vector(std::int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

struct size {
  std::int64_t rows, c;
};
// Includes c above one column block (64) and rows * c above the threading threshold.
const size sizes[] = {{1, 1}, {1, 37}, {37, 1}, {131, 13}, {37, 773}, {131, 1000}, {2000, 37}, {0, 5}, {5, 0}};

} // namespace

TEST_CASE("bias: bias_add adds the bias to every row") {
  std::mt19937 rng(1);
  for (const auto& s : sizes) {
    INFO("rows " << s.rows << " c " << s.c);
    auto y = random_vector(s.rows * s.c, rng);
    const auto bias = random_vector(s.c, rng);
    std::vector<float> expected = y;
    for (std::int64_t r = 0; r < s.rows; ++r)
      for (std::int64_t j = 0; j < s.c; ++j) expected[static_cast<std::size_t>(r * s.c + j)] += bias[static_cast<std::size_t>(j)];
    dsa::cpu::bias_add(y.data(), bias.data(), s.rows, s.c);
    // One f32 addition per element on both sides: exact agreement.
    int mismatches = 0;
    for (std::size_t i = 0; i < y.size(); ++i) mismatches += y[i] != expected[i];
    CHECK(mismatches == 0);
  }
}

TEST_CASE("bias: bias_backward accumulates column sums like the reference") {
  std::mt19937 rng(2);
  for (const auto& s : sizes) {
    INFO("rows " << s.rows << " c " << s.c);
    const auto dy = random_vector(s.rows * s.c, rng);
    auto dbias = random_vector(s.c, rng); // += : starts non-zero
    std::vector<float> expected = dbias;
    dsa::cpu::bias_backward_ref(expected.data(), dy.data(), s.rows, s.c);
    dsa::cpu::bias_backward(dbias.data(), dy.data(), s.rows, s.c);
    DSA_CHECK_CLOSE(dbias.data(), expected.data(), s.c, dsa::test::f32_kernel);
  }
}

TEST_CASE("bias: bias_backward_ref on a hand-computed example") {
  const float dy[] = {1, 2, 3, 4, 5, 6}; // (2, 3)
  float dbias[] = {10, 20, 30};
  dsa::cpu::bias_backward_ref(dbias, dy, 2, 3);
  const float expected[] = {15, 27, 39};
  DSA_CHECK_CLOSE(dbias, expected, 3, dsa::test::f32_kernel);
}

TEST_CASE("bias: every vector path this CPU has gives the same bits") {
  const auto paths = dsa::test::isa_paths();
  std::mt19937 rng(4);
  for (const auto& s : sizes) {
    INFO("rows " << s.rows << " c " << s.c);
    const auto y0 = random_vector(s.rows * s.c, rng);
    const auto bias = random_vector(s.c, rng);
    const auto dbias0 = random_vector(s.c, rng);
    std::vector<float> want_y = y0, want_dbias = dbias0;
    dsa::cpu::bias_add(paths.front(), want_y.data(), bias.data(), s.rows, s.c);
    dsa::cpu::bias_backward(paths.front(), want_dbias.data(), y0.data(), s.rows, s.c);
    for (dsa::cpu::isa path : paths) {
      CAPTURE(dsa::cpu::isa_name(path));
      std::vector<float> y = y0, dbias = dbias0;
      dsa::cpu::bias_add(path, y.data(), bias.data(), s.rows, s.c);
      dsa::cpu::bias_backward(path, dbias.data(), y0.data(), s.rows, s.c);
      CHECK(y == want_y);
      CHECK(dbias == want_dbias);
    }
  }
}

TEST_CASE("bias_add_rounded: the same bits as bias_add then a cast to f16 / bf16, every path; the input unchanged") {
  std::mt19937 rng(77);
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 1}, {3, 17}, {64, 256}, {300, 257}};
  for (auto [rows, c] : shapes) {
    const auto y0 = random_vector(rows * c, rng);
    const auto bias = random_vector(c, rng);
    for (dsa::dtype half : {dsa::dtype::f16, dsa::dtype::bf16}) {
      for (dsa::cpu::isa path : dsa::test::isa_paths()) {
        INFO(dsa::cpu::isa_name(path) << " " << dsa::dtype_name(half) << " rows " << rows << " c " << c);
        auto added = y0;
        dsa::cpu::bias_add(path, added.data(), bias.data(), rows, c);
        std::vector<std::uint16_t> want(added.size()), got(added.size());
        dsa::cpu::cast(want.data(), half, added.data(), dsa::dtype::f32, rows * c);
        const auto y = y0;
        dsa::cpu::bias_add_rounded(path, got.data(), half, y.data(), bias.data(), rows, c);
        CHECK(got == want);
        CHECK(y == y0);
        // The same rows as a column block of a wider product (rows ld = 3c apart, block 1).
        std::vector<float> wide(static_cast<std::size_t>(rows * 3 * c), NAN);
        for (std::int64_t r = 0; r < rows; ++r)
          std::copy(y0.begin() + r * c, y0.begin() + (r + 1) * c, wide.begin() + r * 3 * c + c);
        std::vector<std::uint16_t> from_block(added.size());
        dsa::cpu::bias_add_rounded(path, from_block.data(), half, wide.data() + c, bias.data(), rows, c, 3 * c);
        CHECK(from_block == want);
      }
    }
  }
}

TEST_CASE("bias_backward_rounded: bias_backward's bits and cast's bf16 copy in one pass, every path") {
  std::mt19937 rng(91);
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 1}, {3, 17}, {131, 13}, {300, 257}, {1024, 256}, {0, 5}};
  for (auto [rows, c] : shapes) {
    auto dy = random_vector(rows * c, rng);
    if (rows * c >= 8) { // values whose rounding is special: NaNs (quieted), infinities, a tie, the largest float
      dy[0] = std::numeric_limits<float>::quiet_NaN();
      dy[1] = -std::numeric_limits<float>::infinity();
      dy[2] = dsa::bits_float(0x3f808000u);  // halfway between two bf16 values, even below
      dy[3] = dsa::bits_float(0x3f818000u);  // halfway, even above
      dy[4] = std::numeric_limits<float>::max();
      dy[5] = dsa::bits_float(0x7f800001u);  // a signalling NaN
    }
    const auto dbias0 = random_vector(c, rng);
    for (dsa::cpu::isa path : dsa::test::isa_paths()) {
      INFO(dsa::cpu::isa_name(path) << " rows " << rows << " c " << c);
      std::vector<float> want_dbias = dbias0, dbias = dbias0;
      dsa::cpu::bias_backward(path, want_dbias.data(), dy.data(), rows, c);
      std::vector<std::uint16_t> want(dy.size()), got(dy.size(), 0x1234);
      dsa::cpu::cast(want.data(), dsa::dtype::bf16, dy.data(), dsa::dtype::f32, rows * c);
      dsa::cpu::bias_backward_rounded(path, dbias.data(), got.data(), dy.data(), rows, c);
      CHECK(got == want);
      // bit for bit, NaN columns included
      CHECK(std::memcmp(dbias.data(), want_dbias.data(), dbias.size() * sizeof(float)) == 0);
    }
  }
}
