// Dropout: masks are the Philox definition, reproducible per stream and different
// across streams, keep about 1 - p, and backward applies the mask with 1/(1-p).
#include "kernels/cpu/dropout.hpp"

#include "tests/support/compare.hpp"
#include "tests/support/isa_paths.hpp"
#include "tests/support/same_bits.hpp"
#include "tests/support/random.hpp"
#include "tests/support/tolerances.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

using namespace dsa;

namespace {

using test::random_vector;

std::vector<std::uint8_t> mask_of(const philox_stream& s, float p, std::int64_t n) {
  std::vector<std::uint8_t> m(static_cast<std::size_t>(n));
  cpu::dropout_mask(m.data(), p, s, n);
  return m;
}

std::int64_t count_differences(const std::vector<std::uint8_t>& a,
                               const std::vector<std::uint8_t>& b) {
  std::int64_t d = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    d += a[i] != b[i];
  return d;
}

const philox_stream base_stream{0x0123456789abcdefull, 7, 3, 5, 2};
const std::int64_t awkward_n[] = {1, 3, 7, 37, 1001, 65537}; // 65537 takes the parallel path

} // namespace

TEST_CASE("dropout: the mask is uniform(i) >= p element by element") {
  for (float p : {0.1f, 0.5f, 0.9f}) {
    for (std::int64_t n : awkward_n) {
      CAPTURE(p);
      CAPTURE(n);
      const auto m = mask_of(base_stream, p, n);
      std::int64_t wrong = 0;
      for (std::int64_t i = 0; i < n; ++i)
        wrong += m[static_cast<std::size_t>(i)] !=
                 (base_stream.uniform(static_cast<std::uint64_t>(i)) >= p);
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("dropout: forward keeps masked elements scaled by 1/(1-p) and zeroes the rest") {
  const float p = 0.3f;
  for (std::int64_t n : awkward_n) {
    CAPTURE(n);
    const auto x = random_vector(n, -2.0f, 2.0f, 1);
    std::vector<float> y(x.size());
    std::vector<std::uint8_t> m(x.size());
    cpu::dropout_forward(y.data(), m.data(), x.data(), p, base_stream, n);
    CHECK(m == mask_of(base_stream, p, n)); // recompute gives the forward's mask
    std::vector<double> want(x.size());
    for (std::size_t i = 0; i < x.size(); ++i)
      want[i] = m[i] ? x[i] / (1.0 - static_cast<double>(p)) : 0.0;
    DSA_CHECK_CLOSE(y.data(), want.data(), n, test::f32_kernel);
    std::int64_t nonzero_dropped = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
      nonzero_dropped += !m[i] && y[i] != 0.0f;
    CHECK(nonzero_dropped == 0);
    // In place, and without a mask output, gives the same values.
    auto inplace = x;
    cpu::dropout_forward(inplace.data(), nullptr, inplace.data(), p, base_stream, n);
    CHECK(inplace == y);
  }
}

TEST_CASE("dropout: the same stream gives the same mask; any changed field changes it") {
  const std::int64_t n = 4099;
  const float p = 0.5f;
  const auto reference = mask_of(base_stream, p, n);
  CHECK(mask_of(base_stream, p, n) == reference);
  std::vector<philox_stream> changed(7, base_stream);
  changed[0].seed ^= 1;          // low word of the seed
  changed[1].seed ^= 1ull << 40; // high word of the seed
  changed[2].step += 1;
  changed[3].micro_batch += 1;
  changed[4].layer += 1;
  changed[5].site += 1;
  changed[6].layer = base_stream.site; // layer and site swapped: still a different stream
  changed[6].site = base_stream.layer;
  for (std::size_t k = 0; k < changed.size(); ++k) {
    CAPTURE(k);
    // Independent masks differ in about half the elements: demand at least a third.
    CHECK(count_differences(mask_of(changed[k], p, n), reference) > n / 3);
  }
}

TEST_CASE("dropout: the kept fraction is within 5 sigma of 1 - p") {
  const std::int64_t n = 100000;
  for (float p : {0.1f, 0.5f, 0.9f}) {
    CAPTURE(p);
    const auto m = mask_of(base_stream, p, n);
    std::int64_t kept = 0;
    for (auto e : m)
      kept += e;
    const double expected = static_cast<double>(n) * (1.0 - p);
    const double sigma = std::sqrt(static_cast<double>(n) * p * (1.0 - p));
    CAPTURE(kept);
    CHECK(std::fabs(static_cast<double>(kept) - expected) <= 5.0 * sigma);
  }
}

TEST_CASE("dropout: p = 0 keeps everything unchanged") {
  for (std::int64_t n : awkward_n) {
    CAPTURE(n);
    const auto x = random_vector(n, -2.0f, 2.0f, 2);
    std::vector<float> y(x.size()), dx(x.size());
    std::vector<std::uint8_t> m(x.size(), 0);
    cpu::dropout_forward(y.data(), m.data(), x.data(), 0.0f, base_stream, n);
    CHECK(y == x);
    CHECK(m == std::vector<std::uint8_t>(x.size(), 1));
    CHECK(mask_of(base_stream, 0.0f, n) == m);
    cpu::dropout_backward(dx.data(), x.data(), m.data(), 0.0f, n);
    CHECK(dx == x);
  }
}

TEST_CASE("dropout: backward applies the mask and the 1/(1-p) scale") {
  const float p = 0.25f;
  for (std::int64_t n : awkward_n) {
    CAPTURE(n);
    const auto dy = random_vector(n, -1.0f, 1.0f, 3);
    const auto m = mask_of(base_stream, p, n);
    std::vector<float> dx(dy.size());
    cpu::dropout_backward(dx.data(), dy.data(), m.data(), p, n);
    std::vector<double> want(dy.size());
    for (std::size_t i = 0; i < dy.size(); ++i)
      want[i] = m[i] ? dy[i] / (1.0 - static_cast<double>(p)) : 0.0;
    DSA_CHECK_CLOSE(dx.data(), want.data(), n, test::f32_kernel);
    auto inplace = dy;
    cpu::dropout_backward(inplace.data(), inplace.data(), m.data(), p, n);
    CHECK(inplace == dx);
    // Backward is the adjoint of forward: <dy, forward(x)> = <backward(dy), x>.
    const auto x = random_vector(n, -1.0f, 1.0f, 4);
    std::vector<float> y(x.size());
    cpu::dropout_forward(y.data(), nullptr, x.data(), p, base_stream, n);
    double lhs = 0.0, rhs = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      lhs += static_cast<double>(dy[i]) * y[i];
      rhs += static_cast<double>(dx[i]) * x[i];
    }
    DSA_CHECK_CLOSE(&lhs, &rhs, 1, test::f32_kernel);
  }
}

TEST_CASE("dropout: every vector path gives the scalar path's bits: forward, mask, backward, with a residual") {
  for (float p : {0.0f, 0.15f, 0.6f}) {
    for (std::int64_t n : awkward_n) {
      CAPTURE(p);
      CAPTURE(n);
      auto x = random_vector(n, -2.0f, 2.0f, 11);
      auto r = random_vector(n, -1.0f, 1.0f, 12);
      // Specials: a dropped inf or NaN gives +0, a kept one stays; -0.0 stays -0.0 when kept.
      const float specials[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN(), -0.0f};
      for (std::size_t s = 0; s < 4; ++s)
        for (std::size_t at = s; at < x.size(); at += 29) x[at] = specials[s];
      for (std::size_t at = 5; at < r.size(); at += 31) r[at] = -0.0f;
      const std::size_t N = static_cast<std::size_t>(n);
      std::vector<float> y0(N), yr0(N), dx0(N);
      std::vector<std::uint8_t> m0(N), mm0(N);
      cpu::dropout_forward(cpu::isa::scalar, y0.data(), m0.data(), x.data(), p, base_stream, n);
      cpu::dropout_mask(cpu::isa::scalar, mm0.data(), p, base_stream, n);
      cpu::dropout_backward(cpu::isa::scalar, dx0.data(), x.data(), m0.data(), p, n);
      cpu::dropout_residual_forward(cpu::isa::scalar, yr0.data(), x.data(), r.data(), p, base_stream, n);
      // The scalar path against the definition.
      CHECK(mm0 == m0);
      CHECK(test::same_bits(dx0, y0)); // backward applies the same mask and scale
      const float scale = 1.0f / (1.0f - p);
      std::vector<float> def_y(N), def_yr(N);
      for (std::size_t i = 0; i < N; ++i) {
        const bool keep = base_stream.uniform(i) >= p;
        REQUIRE(m0[i] == (keep ? 1 : 0));
        def_y[i] = keep ? x[i] * scale : 0.0f;
        def_yr[i] = def_y[i] + r[i];
      }
      CHECK(test::same_bits(y0, def_y));
      CHECK(test::same_bits(yr0, def_yr));
      for (cpu::isa path : test::isa_paths()) {
        CAPTURE(cpu::isa_name(path));
        std::vector<float> y(N), yr(N), dx(N);
        std::vector<std::uint8_t> m(N), mm(N);
        cpu::dropout_forward(path, y.data(), m.data(), x.data(), p, base_stream, n);
        CHECK(test::same_bits(y, y0));
        CHECK(m == m0);
        cpu::dropout_forward(path, y.data(), nullptr, x.data(), p, base_stream, n);
        CHECK(test::same_bits(y, y0));
        cpu::dropout_mask(path, mm.data(), p, base_stream, n);
        CHECK(mm == m0);
        cpu::dropout_backward(path, dx.data(), x.data(), m0.data(), p, n);
        CHECK(test::same_bits(dx, dx0));
        cpu::dropout_residual_forward(path, yr.data(), x.data(), r.data(), p, base_stream, n);
        CHECK(test::same_bits(yr, yr0));
        // In place over the branch and over the residual.
        auto over_x = x, over_r = r;
        cpu::dropout_residual_forward(path, over_x.data(), over_x.data(), r.data(), p, base_stream, n);
        cpu::dropout_residual_forward(path, over_r.data(), x.data(), over_r.data(), p, base_stream, n);
        CHECK(test::same_bits(over_x, yr0));
        CHECK(test::same_bits(over_r, yr0));
      }
    }
  }
}

TEST_CASE("dropout_range: any slice of a stream gives the bits of the whole tensor's dropout, every path") {
  const std::int64_t n = 1301; // past a 256-element group, odd
  const auto x = random_vector(n, -2.0f, 2.0f, 21);
  for (float p : {0.0f, 0.1f, 0.5f}) {
    std::vector<float> whole(static_cast<std::size_t>(n));
    cpu::dropout_forward(cpu::isa::scalar, whole.data(), nullptr, x.data(), p, base_stream, n);
    for (cpu::isa path : test::isa_paths()) {
      // Slices starting on and off a Philox block and a group, crossing groups, empty.
      for (auto [begin, count] : {std::pair<std::int64_t, std::int64_t>{0, n}, {1, 3}, {3, 258}, {4, 4}, {255, 2},
                                  {257, 1000}, {1300, 1}, {17, 0}}) {
        CAPTURE(cpu::isa_name(path));
        CAPTURE(p);
        CAPTURE(begin);
        CAPTURE(count);
        const auto b = static_cast<std::size_t>(begin), e = static_cast<std::size_t>(begin + count);
        std::vector<float> got(static_cast<std::size_t>(count));
        cpu::dropout_range(path, got.data(), x.data() + b, p, base_stream, begin, count);
        CHECK(test::same_bits(got, std::vector<float>(whole.begin() + static_cast<std::ptrdiff_t>(b),
                                                      whole.begin() + static_cast<std::ptrdiff_t>(e))));
        std::vector<float> in_place(x.begin() + static_cast<std::ptrdiff_t>(b), x.begin() + static_cast<std::ptrdiff_t>(e));
        cpu::dropout_range(path, in_place.data(), in_place.data(), p, base_stream, begin, count);
        CHECK(test::same_bits(in_place, got));
      }
    }
  }
}
