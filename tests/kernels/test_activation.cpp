// kernels/cpu/activation: GELU and tanh kernels against the double references,
// the backward passes against central differences of a double forward, and the
// vectorized erf of kernels/cpu/vec_math against std::erf in double.
#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/bias.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/vec_math.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/isa_paths.hpp"
#include "tests/support/same_bits.hpp"
#include "tests/support/finite_diff.hpp"
#include "tests/support/tolerances.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

std::vector<float> random_vector(std::int64_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v)
    x = dist(rng);
  return v;
}

double gelu_double(double x) {
  return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}

// Awkward lengths, and one above the threading threshold.
const std::int64_t lengths[] = {1, 7, 37, 131, 1000, (std::int64_t{1} << 16) + 3};

// Extremes and zero placed in front of random data in [-6, 6].
std::vector<float> activation_inputs(std::int64_t n, std::mt19937& rng) {
  auto x = random_vector(n, -6.0f, 6.0f, rng);
  const float specials[] = {0.0f, -0.0f, 10.0f, -10.0f, 1e-20f, -30.0f, 30.0f};
  for (std::size_t i = 0; i < x.size() && i < 7; ++i)
    x[i] = specials[i];
  return x;
}

// |got - exact| in ulps of the float nearest exact (subnormals: of the smallest subnormal).
double ulp_error(float got, double exact) {
  if (std::isnan(exact))
    return std::isnan(got) ? 0.0 : std::numeric_limits<double>::infinity();
  const int exponent = std::max(std::ilogb(static_cast<float>(exact)), -126);
  return std::fabs(static_cast<double>(got) - exact) / std::ldexp(1.0, exponent - 23);
}

struct worst_ulp {
  double ulps = 0.0;
  float x = 0.0f;
  void add(float got, float at) {
    const double e = ulp_error(got, std::erf(static_cast<double>(at)));
    if (!(e <= ulps)) {
      ulps = e;
      x = at;
    }
  }
};

} // namespace

TEST_CASE("activation: vectorized erf vs std::erf in double, max ulp error") {
  constexpr float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::denorm_min(),
                            -1e-40f,
                            std::numeric_limits<float>::min(),
                            1e-20f,
                            1.0f,
                            -1.0f,
                            std::nextafter(1.0f, 2.0f),
                            3.9192f,
                            4.0f,
                            -4.0f,
                            1e30f,
                            -3e38f,
                            inf,
                            -inf};
  // A dense sweep of [-10, 10] in steps of 2^-19 (both polynomials, their seam at |x| = 1
  // and the saturation near 3.92), then the special values; the length is not a multiple
  // of 8, so the masked tail is exercised.
  constexpr int step_log2 = 19;
  std::vector<float> x;
  for (std::int64_t i = -10 * (std::int64_t{1} << step_log2);
       i <= 10 * (std::int64_t{1} << step_log2); ++i)
    x.push_back(std::ldexp(static_cast<float>(i), -step_log2));
  x.insert(x.end(), std::begin(specials), std::end(specials));
  std::vector<float> y(x.size());
  dsa::cpu::vec::erf(y.data(), x.data(), static_cast<std::int64_t>(x.size()));
  worst_ulp array_form, scalar_form;
  for (std::size_t i = 0; i < x.size(); ++i) {
    array_form.add(y[i], x[i]);
    scalar_form.add(dsa::cpu::vec::erf(x[i]), x[i]);
  }
  INFO("array form: " << array_form.ulps << " ulp at x = " << array_form.x);
  INFO("scalar form: " << scalar_form.ulps << " ulp at x = " << scalar_form.x);
  CHECK(array_form.ulps <= dsa::test::erf_f32.ulps);
  CHECK(scalar_form.ulps <= dsa::test::erf_f32.ulps);
  MESSAGE("erf max error: array " << array_form.ulps << " ulp at " << array_form.x << ", scalar "
                                  << scalar_form.ulps << " ulp at " << scalar_form.x);

  // Exact values: odd with signed zero, saturation, NaN propagation.
  const float exact_in[] = {0.0f, -0.0f, 4.0f, -4.0f, inf, -inf};
  const float exact_out[] = {0.0f, -0.0f, 1.0f, -1.0f, 1.0f, -1.0f};
  float out[6];
  dsa::cpu::vec::erf(out, exact_in, 6);
  for (int i = 0; i < 6; ++i) {
    INFO("x = " << exact_in[i]);
    CHECK(out[i] == exact_out[i]);
    CHECK(std::signbit(out[i]) == std::signbit(exact_out[i]));
    CHECK(dsa::cpu::vec::erf(exact_in[i]) == exact_out[i]);
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float nan_out = 0.0f;
  dsa::cpu::vec::erf(&nan_out, &nan, 1);
  CHECK(std::isnan(nan_out));
  CHECK(std::isnan(dsa::cpu::vec::erf(nan)));
}

TEST_CASE("activation: gelu forward and backward match the double references") {
  std::mt19937 rng(1);
  for (std::int64_t n : lengths) {
    INFO("n " << n);
    const auto x = activation_inputs(n, rng);
    const auto dy = random_vector(n, -2.0f, 2.0f, rng);
    std::vector<float> y(x.size()), y_ref(x.size()), dx(x.size()), dx_ref(x.size());
    dsa::cpu::gelu_forward(y.data(), x.data(), n);
    dsa::cpu::gelu_forward_ref(y_ref.data(), x.data(), n);
    DSA_CHECK_CLOSE(y.data(), y_ref.data(), n, dsa::test::f32_kernel);
    dsa::cpu::gelu_backward(dx.data(), dy.data(), x.data(), n);
    dsa::cpu::gelu_backward_ref(dx_ref.data(), dy.data(), x.data(), n);
    DSA_CHECK_CLOSE(dx.data(), dx_ref.data(), n, dsa::test::f32_kernel);
    // In place: y aliases x, dx aliases dy.
    std::vector<float> inplace = x;
    dsa::cpu::gelu_forward(inplace.data(), inplace.data(), n);
    DSA_CHECK_CLOSE(inplace.data(), y.data(), n, dsa::test::recompute);
    inplace = dy;
    dsa::cpu::gelu_backward(inplace.data(), inplace.data(), x.data(), n);
    DSA_CHECK_CLOSE(inplace.data(), dx.data(), n, dsa::test::recompute);
  }
}

TEST_CASE("activation: gelu on every vector path this CPU has: the double references, and AVX-512 = AVX2 bit for bit") {
  const auto paths = dsa::test::isa_paths();
  MESSAGE("gelu paths checked up to " << dsa::cpu::isa_name(paths.back()));
  std::mt19937 rng(3);
  for (std::int64_t n : lengths) {
    INFO("n " << n);
    auto x = activation_inputs(n, rng);
    if (n > 4) x[1] = -0.0f, x[2] = 40.0f, x[3] = -40.0f; // a signed zero and both saturations
    const auto dy = random_vector(n, -2.0f, 2.0f, rng);
    std::vector<float> y_ref(x.size()), dx_ref(x.size());
    dsa::cpu::gelu_forward_ref(y_ref.data(), x.data(), n);
    dsa::cpu::gelu_backward_ref(dx_ref.data(), dy.data(), x.data(), n);
    std::vector<std::vector<float>> ys, dxs;
    for (dsa::cpu::isa path : paths) {
      CAPTURE(dsa::cpu::isa_name(path));
      std::vector<float> y(x.size()), dx(x.size());
      dsa::cpu::gelu_forward(path, y.data(), x.data(), n);
      dsa::cpu::gelu_backward(path, dx.data(), dy.data(), x.data(), n);
      DSA_CHECK_CLOSE(y.data(), y_ref.data(), n, dsa::test::f32_kernel);
      DSA_CHECK_CLOSE(dx.data(), dx_ref.data(), n, dsa::test::f32_kernel);
      ys.push_back(y);
      dxs.push_back(dx);
    }
    if (paths.size() == 3 && DSA_VEC_MATH_AVX2) { // the avx2 path is the AVX2 form only in an AVX2 build
      CHECK(std::memcmp(ys[2].data(), ys[1].data(), ys[1].size() * 4) == 0);
      CHECK(std::memcmp(dxs[2].data(), dxs[1].data(), dxs[1].size() * 4) == 0);
    }
  }
}

TEST_CASE("activation: gelu backward vs central differences in double") {
  std::mt19937 rng(2);
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{37}, std::int64_t{131}}) {
    INFO("n " << n);
    const auto x = activation_inputs(n, rng);
    const auto dy = random_vector(n, -2.0f, 2.0f, rng);
    // d/dx_i of sum_j dy_j * gelu(x_j), the forward in double.
    std::vector<double> xd(x.begin(), x.end());
    auto loss = [&] {
      double s = 0.0;
      for (std::size_t j = 0; j < xd.size(); ++j)
        s += dy[j] * gelu_double(xd[j]);
      return s;
    };
    const auto fd = dsa::test::central_difference(xd, loss, 1e-6);
    std::vector<float> dx_ref(x.size()), dx(x.size());
    dsa::cpu::gelu_backward_ref(dx_ref.data(), dy.data(), x.data(), n);
    dsa::cpu::gelu_backward(dx.data(), dy.data(), x.data(), n);
    DSA_CHECK_CLOSE(dx_ref.data(), fd.data(), n, dsa::test::finite_diff);
    DSA_CHECK_CLOSE(dx.data(), fd.data(), n, dsa::test::f32_kernel);
  }
}

TEST_CASE("activation: tanh forward vs double, backward vs central differences") {
  std::mt19937 rng(3);
  for (std::int64_t n : lengths) {
    INFO("n " << n);
    const auto x = activation_inputs(n, rng);
    const auto dy = random_vector(n, -2.0f, 2.0f, rng);
    std::vector<float> y(x.size()), dx(x.size());
    std::vector<double> y_double(x.size());
    for (std::size_t i = 0; i < x.size(); ++i)
      y_double[i] = std::tanh(static_cast<double>(x[i]));
    dsa::cpu::tanh_forward(y.data(), x.data(), n);
    DSA_CHECK_CLOSE(y.data(), y_double.data(), n, dsa::test::f32_kernel);
    dsa::cpu::tanh_backward(dx.data(), dy.data(), y.data(), n);
    // Elementwise, so one central difference per element of the double forward.
    std::vector<double> fd(x.size());
    const double h = 1e-6;
    for (std::size_t i = 0; i < x.size(); ++i)
      fd[i] = dy[i] * (std::tanh(x[i] + h) - std::tanh(x[i] - h)) / (2 * h);
    DSA_CHECK_CLOSE(dx.data(), fd.data(), n, dsa::test::f32_kernel);
    // In place: dx aliases dy.
    std::vector<float> inplace = dy;
    dsa::cpu::tanh_backward(inplace.data(), inplace.data(), y.data(), n);
    DSA_CHECK_CLOSE(inplace.data(), dx.data(), n, dsa::test::recompute);
  }
}

// The fused bias + GELU of a feed-forward layer against the two kernels it replaces, on
// every path: rows x columns with a partial column block, and one above the threading size.
TEST_CASE("gelu_bias_forward / backward: the same bits as bias_add + gelu and gelu + bias_backward, every path") {
  std::mt19937 rng(91);
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 1}, {3, 7}, {5, 300}, {37, 1024}, {80, 1000}};
  for (auto [rows, c] : shapes) {
    const std::int64_t n = rows * c;
    const auto x0 = random_vector(n, -4.0f, 4.0f, rng);
    const auto bias = random_vector(c, -1.0f, 1.0f, rng);
    const auto dy = random_vector(n, -1.0f, 1.0f, rng);
    const auto db0 = random_vector(c, -1.0f, 1.0f, rng);
    for (dsa::cpu::isa path : dsa::test::isa_paths()) {
      INFO(dsa::cpu::isa_name(path) << " rows " << rows << " c " << c);
      // Separately: x += bias, y = gelu(x); dx = gelu'(x) dy, dbias += column sums of dx.
      std::vector<float> want_x = x0, want_y(n), want_dx(n), want_db = db0;
      dsa::cpu::bias_add(path, want_x.data(), bias.data(), rows, c);
      dsa::cpu::gelu_forward(path, want_y.data(), want_x.data(), n);
      dsa::cpu::gelu_backward(path, want_dx.data(), dy.data(), want_x.data(), n);
      dsa::cpu::bias_backward(path, want_db.data(), want_dx.data(), rows, c);
      std::vector<float> x = x0, y(n), db = db0;
      dsa::cpu::gelu_bias_forward(path, y.data(), x.data(), bias.data(), rows, c);
      CHECK(dsa::test::same_bits(x, want_x));
      CHECK(dsa::test::same_bits(y, want_y));
      auto dx = dy; // in place over dy, as the feed-forward layer calls it
      dsa::cpu::gelu_bias_backward(path, dx.data(), db.data(), dx.data(), x.data(), rows, c);
      CHECK(dsa::test::same_bits(dx, want_dx));
      CHECK(dsa::test::same_bits(db, want_db));
    }
  }
}

TEST_CASE("gelu_bias_forward_half: the same bits as gelu_bias_forward then rounding both results, every path") {
  std::mt19937 rng(93);
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 1}, {3, 7}, {37, 1024}, {80, 1000}};
  for (auto [rows, c] : shapes) {
    const std::int64_t n = rows * c;
    const auto x0 = random_vector(n, -4.0f, 4.0f, rng);
    const auto bias = random_vector(c, -1.0f, 1.0f, rng);
    for (dsa::dtype half : {dsa::dtype::f16, dsa::dtype::bf16}) {
      for (dsa::cpu::isa path : dsa::test::isa_paths()) {
        INFO(dsa::cpu::isa_name(path) << " " << dsa::dtype_name(half) << " rows " << rows << " c " << c);
        std::vector<float> x = x0, y(n);
        dsa::cpu::gelu_bias_forward(path, y.data(), x.data(), bias.data(), rows, c);
        std::vector<std::uint16_t> want_x(n), want_y(n), got_x(n), got_y(n);
        dsa::cpu::cast(want_x.data(), half, x.data(), dsa::dtype::f32, n);
        dsa::cpu::cast(want_y.data(), half, y.data(), dsa::dtype::f32, n);
        const auto untouched = x0;
        dsa::cpu::gelu_bias_forward_half(path, got_y.data(), got_x.data(), half, untouched.data(), bias.data(), rows, c);
        CHECK(got_x == want_x);
        CHECK(got_y == want_y);
      }
    }
  }
}

TEST_CASE("gelu_bias_backward from an f16 / bf16 x: the bits of the f32 form on the widened x, also rounded to bf16, every path") {
  std::mt19937 rng(95);
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 1}, {5, 300}, {80, 1000}};
  for (auto [rows, c] : shapes) {
    const std::int64_t n = rows * c;
    const auto x32 = random_vector(n, -4.0f, 4.0f, rng);
    const auto dy = random_vector(n, -1.0f, 1.0f, rng);
    const auto db0 = random_vector(c, -1.0f, 1.0f, rng);
    for (dsa::dtype half : {dsa::dtype::f16, dsa::dtype::bf16}) {
      std::vector<std::uint16_t> xh(n);
      std::vector<float> widened(n);
      dsa::cpu::cast(xh.data(), half, x32.data(), dsa::dtype::f32, n);
      dsa::cpu::cast(widened.data(), dsa::dtype::f32, xh.data(), half, n);
      for (dsa::cpu::isa path : dsa::test::isa_paths()) {
        INFO(dsa::cpu::isa_name(path) << " " << dsa::dtype_name(half) << " rows " << rows << " c " << c);
        std::vector<float> want_dx(n), want_db = db0, dx(n), db = db0;
        dsa::cpu::gelu_bias_backward(path, want_dx.data(), want_db.data(), dy.data(), widened.data(), rows, c);
        dsa::cpu::gelu_bias_backward(path, dx.data(), db.data(), dy.data(), xh.data(), half, rows, c);
        CHECK(dsa::test::same_bits(dx, want_dx));
        CHECK(dsa::test::same_bits(db, want_db));
        // Only the bf16 rounding of dx written: the cast of the f32 result, the same dbias.
        std::vector<std::uint16_t> want_rounded(n), rounded(n);
        std::vector<float> db_rounded = db0;
        dsa::cpu::cast(path, want_rounded.data(), dsa::dtype::bf16, want_dx.data(), dsa::dtype::f32, n);
        dsa::cpu::gelu_bias_backward(path, nullptr, rounded.data(), db_rounded.data(), dy.data(), xh.data(), half,
                                     rows, c);
        CHECK(rounded == want_rounded);
        CHECK(dsa::test::same_bits(db_rounded, want_db));
      }
    }
  }
}
