// kernels/cpu/activation: GELU and tanh kernels against the double references,
// and the backward passes against central differences of a double forward.
#include "kernels/cpu/activation.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/finite_diff.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

namespace {

std::vector<float> random_vector(std::int64_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

double gelu_double(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

// Awkward lengths, and one above the threading threshold.
const std::int64_t lengths[] = {1, 7, 37, 131, 1000, (std::int64_t{1} << 16) + 3};

// Extremes and zero placed in front of random data in [-6, 6].
std::vector<float> activation_inputs(std::int64_t n, std::mt19937& rng) {
  auto x = random_vector(n, -6.0f, 6.0f, rng);
  const float specials[] = {0.0f, -0.0f, 10.0f, -10.0f, 1e-20f, -30.0f, 30.0f};
  for (std::size_t i = 0; i < x.size() && i < 7; ++i) x[i] = specials[i];
  return x;
}

} // namespace

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
      for (std::size_t j = 0; j < xd.size(); ++j) s += dy[j] * gelu_double(xd[j]);
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
    for (std::size_t i = 0; i < x.size(); ++i) y_double[i] = std::tanh(static_cast<double>(x[i]));
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
