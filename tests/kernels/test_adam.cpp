// Tests for kernels/cpu/adam: the vectorized kernel against the double reference,
// against values worked out by hand, and the half copy-out against converting the f32 result.
#include "kernels/cpu/adam.hpp"

#include "core/half.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/isa_paths.hpp"
#include "tests/support/same_bits.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

using dsa::cpu::adam_mode;
using dsa::cpu::adam_params;
using dsa::cpu::bias_correction;

struct adam_state {
  std::vector<float> param, m, v;
};

adam_state random_state(std::int64_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  adam_state s{std::vector<float>(n), std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
  for (auto& x : s.param) x = u(rng);
  return s;
}

std::vector<float> random_grad(std::int64_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> g(n);
  for (auto& x : g) x = u(rng);
  return g;
}

// One element, one step through the kernel.
void step_one(float& p, float& m, float& v, float g, adam_params params) {
  dsa::cpu::adam_update(&p, &m, &v, &g, nullptr, dsa::dtype::f16, params, 1);
}

} // namespace

TEST_CASE("adam: kernel matches the double reference over several steps") {
  // 1, primes, a non-multiple of 8, and sizes spanning several OpenMP chunks of 16384.
  for (std::int64_t n : {1, 7, 13, 257, 1031, 16384 * 3 + 5}) {
    for (adam_mode mode : {adam_mode::adam, adam_mode::adamw}) {
      for (bias_correction bc : {bias_correction::on, bias_correction::off}) {
        CAPTURE(n);
        CAPTURE(static_cast<int>(mode));
        CAPTURE(static_cast<int>(bc));
        adam_state k = random_state(n, 1), r = random_state(n, 1);
        adam_params params;
        params.lr = 1e-2f;
        params.weight_decay = 0.01f;
        params.mode = mode;
        params.correction = bc;
        for (std::int64_t t = 1; t <= 5; ++t) {
          params.step = t;
          auto g = random_grad(n, static_cast<std::uint32_t>(100 + t));
          dsa::cpu::adam_update(k.param.data(), k.m.data(), k.v.data(), g.data(), nullptr, dsa::dtype::f16, params, n);
          dsa::cpu::adam_update_ref(r.param.data(), r.m.data(), r.v.data(), g.data(), params, n);
        }
        DSA_CHECK_CLOSE(k.m.data(), r.m.data(), n, dsa::test::optimizer_step);
        DSA_CHECK_CLOSE(k.v.data(), r.v.data(), n, dsa::test::optimizer_step);
        DSA_CHECK_CLOSE(k.param.data(), r.param.data(), n, dsa::test::optimizer_step);
      }
    }
  }
}

TEST_CASE("adam: two steps by hand, bias correction on, no weight decay") {
  // lr 0.1, betas (0.9, 0.999), eps 1e-8; p0 = 1, g1 = 0.5, g2 = -0.25.
  adam_params params;
  params.lr = 0.1f;
  float p = 1.0f, m = 0.0f, v = 0.0f;
  // Step 1: m = 0.1*0.5 = 0.05; v = 0.001*0.25 = 0.00025
  //   den = sqrt(0.00025)/sqrt(1-0.999) + 1e-8 = 0.5 + 1e-8
  //   p = 1 - 0.1/(1-0.9) * 0.05 / (0.5 + 1e-8) = 1 - 0.1/(1 + 2e-8) = 0.900000002
  params.step = 1;
  step_one(p, m, v, 0.5f, params);
  const double m1 = 0.05, v1 = 0.00025, p1 = 1.0 - 0.1 / 0.1 * 0.05 / (0.5 + 1e-8);
  CHECK(m == doctest::Approx(m1).epsilon(1e-6));
  CHECK(v == doctest::Approx(v1).epsilon(1e-6));
  CHECK(p == doctest::Approx(p1).epsilon(1e-7));
  // Step 2: m = 0.9*0.05 + 0.1*(-0.25) = 0.02; v = 0.999*0.00025 + 0.001*0.0625 = 0.00031225
  //   1-0.9^2 = 0.19, 1-0.999^2 = 0.001999
  //   p = p1 - 0.1/0.19 * 0.02 / (sqrt(0.00031225)/sqrt(0.001999) + 1e-8) = 0.8733662987
  params.step = 2;
  step_one(p, m, v, -0.25f, params);
  const double p2 = p1 - 0.1 / 0.19 * 0.02 / (std::sqrt(0.00031225) / std::sqrt(0.001999) + 1e-8);
  CHECK(m == doctest::Approx(0.02).epsilon(1e-6));
  CHECK(v == doctest::Approx(0.00031225).epsilon(1e-6));
  CHECK(p == doctest::Approx(p2).epsilon(1e-7));
  CHECK(p2 == doctest::Approx(0.8733662987).epsilon(1e-9));
}

TEST_CASE("adam: two steps by hand, bias correction off") {
  // Without bias correction the f32 betas no longer cancel, so the arithmetic uses them:
  // 1 - 0.9f = 0.100000024, 1 - 0.999f = 0.000999987125.
  const double b1 = 0.9f, b2 = 0.999f;
  adam_params params;
  params.lr = 0.1f;
  params.correction = bias_correction::off;
  float p = 1.0f, m = 0.0f, v = 0.0f;
  // Step 1: m = (1-b1)*0.5 ~ 0.05, v = (1-b2)*0.25 ~ 0.00025
  //   p = 1 - 0.1 * m / (sqrt(v) + 1e-8) ~ 1 - 0.1 * 0.05 / 0.0158114 = 0.68377
  params.step = 1;
  step_one(p, m, v, 0.5f, params);
  const double m1 = (1 - b1) * 0.5, v1 = (1 - b2) * 0.25;
  const double p1 = 1.0 - 0.1 * m1 / (std::sqrt(v1) + 1e-8);
  CHECK(p == doctest::Approx(p1).epsilon(1e-7));
  // Step 2: m = b1 m1 - (1-b1) 0.25 ~ 0.02, v = b2 v1 + (1-b2) 0.0625 ~ 0.00031225
  //   p = p1 - 0.1 * m / (sqrt(v) + 1e-8) ~ 0.57059
  params.step = 2;
  step_one(p, m, v, -0.25f, params);
  const double m2 = b1 * m1 - (1 - b1) * 0.25, v2 = b2 * v1 + (1 - b2) * 0.0625;
  const double p2 = p1 - 0.1 * m2 / (std::sqrt(v2) + 1e-8);
  CHECK(m == doctest::Approx(m2).epsilon(1e-6));
  CHECK(v == doctest::Approx(v2).epsilon(1e-6));
  CHECK(p == doctest::Approx(p2).epsilon(1e-7));
  // With exact decimal betas the same two steps give 0.5705901310; f32 betas move it by ~3e-6.
  CHECK(p2 == doctest::Approx(0.5705901310).epsilon(1e-5));
}

TEST_CASE("adam: two elements by hand with weight decay in both modes") {
  // lr 0.1, wd 0.1, bias correction on; element 0: p0 = 2, g = 0.5 twice; element 1: p0 = 0 (no decay effect).
  adam_params params;
  params.lr = 0.1f;
  params.weight_decay = 0.1f;
  SUBCASE("adamw: p -= lr*wd*p before the update") {
    params.mode = adam_mode::adamw;
    float p[2] = {2.0f, 0.0f}, m[2] = {0, 0}, v[2] = {0, 0}, g[2] = {0.5f, 0.5f};
    // Step 1: p = 2 - 0.1*0.1*2 = 1.98; then - 0.1/0.1 * 0.05/(0.5+1e-8) -> 1.880000002
    params.step = 1;
    dsa::cpu::adam_update(p, m, v, g, nullptr, dsa::dtype::f16, params, 2);
    const double p1 = 2.0 - 0.02 - 1.0 * 0.05 / (0.5 + 1e-8);
    CHECK(p[0] == doctest::Approx(p1).epsilon(1e-7));
    // Step 2: m = 0.045+0.05 = 0.095; v = 0.00024975+0.00025 = 0.00049975
    //   p = p1*(1-0.01) - 0.1/0.19 * 0.095 / (sqrt(0.00049975/0.001999) + 1e-8) = 1.7612000040
    params.step = 2;
    dsa::cpu::adam_update(p, m, v, g, nullptr, dsa::dtype::f16, params, 2);
    const double p2 = p1 * 0.99 - 0.1 / 0.19 * 0.095 / (std::sqrt(0.00049975 / 0.001999) + 1e-8);
    CHECK(p[0] == doctest::Approx(p2).epsilon(1e-7));
    CHECK(p2 == doctest::Approx(1.7612000040).epsilon(1e-9));
    // Element 1 (p0 = 0): step 1 has no decay, p1 = -0.1/(1+2e-8); step 2 decays it and takes element 0's step.
    CHECK(p[1] == doctest::Approx(-0.1 / (1 + 2e-8) * 0.99 - 0.1 / 0.19 * 0.095 / (std::sqrt(0.00049975 / 0.001999) + 1e-8))
                      .epsilon(1e-6));
  }
  SUBCASE("adam (L2): g += wd*p before the moments") {
    params.mode = adam_mode::adam;
    float p[2] = {2.0f, 0.0f}, m[2] = {0, 0}, v[2] = {0, 0}, g[2] = {0.5f, 0.5f};
    // Step 1: g' = 0.5 + 0.1*2 = 0.7; m = 0.07; v = 0.00049; den = 0.7 + 1e-8
    //   p = 2 - 1.0 * 0.07/(0.7+1e-8) = 1.9000000014
    params.step = 1;
    dsa::cpu::adam_update(p, m, v, g, nullptr, dsa::dtype::f16, params, 2);
    const double p1 = 2.0 - 0.07 / (0.7 + 1e-8);
    CHECK(m[0] == doctest::Approx(0.07).epsilon(1e-6));
    CHECK(p[0] == doctest::Approx(p1).epsilon(1e-7));
    // Step 2: g' = 0.5 + 0.1*p1; m = 0.9*0.07 + 0.1 g'; v = 0.999*0.00049 + 0.001 g'^2
    params.step = 2;
    dsa::cpu::adam_update(p, m, v, g, nullptr, dsa::dtype::f16, params, 2);
    const double g2 = 0.5 + 0.1 * p1, m2 = 0.063 + 0.1 * g2, v2 = 0.999 * 0.00049 + 0.001 * g2 * g2;
    const double p2 = p1 - 0.1 / 0.19 * m2 / (std::sqrt(v2 / 0.001999) + 1e-8);
    CHECK(m[0] == doctest::Approx(m2).epsilon(1e-6));
    CHECK(p[0] == doctest::Approx(p2).epsilon(1e-7));
    CHECK(p2 == doctest::Approx(1.8000400944).epsilon(1e-9));
  }
}

TEST_CASE("adam: half copy-out equals converting the f32 result, and leaves the f32 result unchanged") {
  for (dsa::dtype half : {dsa::dtype::f16, dsa::dtype::bf16}) {
    for (std::int64_t n : {1, 13, 1031, 16384 * 2 + 3}) {
      CAPTURE(n);
      CAPTURE(dsa::dtype_name(half));
      adam_state a = random_state(n, 7), b = random_state(n, 7);
      auto g = random_grad(n, 8);
      std::vector<std::uint16_t> out(n, 0xdead);
      adam_params params;
      params.lr = 0.05f;
      dsa::cpu::adam_update(a.param.data(), a.m.data(), a.v.data(), g.data(), out.data(), half, params, n);
      dsa::cpu::adam_update(b.param.data(), b.m.data(), b.v.data(), g.data(), nullptr, half, params, n);
      std::int64_t bad_half = 0, bad_f32 = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t want = half == dsa::dtype::f16 ? dsa::f32_to_f16(a.param[i]) : dsa::f32_to_bf16(a.param[i]);
        bad_half += out[i] != want;
        bad_f32 += dsa::float_bits(a.param[i]) != dsa::float_bits(b.param[i]);
      }
      CHECK(bad_half == 0);
      CHECK(bad_f32 == 0);
    }
  }
}

TEST_CASE("adam: an element's result does not depend on its position (vector body vs scalar tail)") {
  const std::int64_t n = 29;
  adam_state all = random_state(n, 3);
  auto g = random_grad(n, 4);
  adam_params params;
  params.weight_decay = 0.01f;
  params.step = 3;
  adam_state single = all;
  dsa::cpu::adam_update(all.param.data(), all.m.data(), all.v.data(), g.data(), nullptr, dsa::dtype::f16, params, n);
  std::int64_t differ = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    step_one(single.param[i], single.m[i], single.v[i], g[i], params);
    differ += dsa::float_bits(single.param[i]) != dsa::float_bits(all.param[i]);
  }
  CHECK(differ == 0);
}

TEST_CASE("adam: every vector path gives the scalar path's bits, half copy-out included") {
  const std::int64_t n = 40000 + 13; // several chunks, a vector body and a tail on every path
  for (adam_mode mode : {adam_mode::adam, adam_mode::adamw}) {
    for (dsa::dtype half : {dsa::dtype::f16, dsa::dtype::bf16}) {
      adam_params params;
      params.mode = mode;
      params.weight_decay = 0.01f;
      params.step = 4;
      auto g = random_grad(n, 21);
      // Specials in the vector body and in the tail: the half copy of a NaN is canonical on every path.
      for (std::int64_t at : {std::int64_t{3}, std::int64_t{17}, n - 2})
        g[at] = std::numeric_limits<float>::quiet_NaN();
      g[40] = -std::numeric_limits<float>::infinity();
      g[n - 1] = std::numeric_limits<float>::infinity();
      adam_state want = random_state(n, 22);
      want.m = random_grad(n, 23);
      for (std::int64_t i = 0; i < n; ++i) want.v[i] = std::fabs(want.m[i]) * 0.5f;
      const adam_state start = want;
      std::vector<std::uint16_t> want_half(n);
      dsa::cpu::adam_update(dsa::cpu::isa::scalar, want.param.data(), want.m.data(), want.v.data(), g.data(),
                            want_half.data(), half, params, n);
      for (dsa::cpu::isa path : dsa::test::isa_paths()) {
        INFO(dsa::cpu::isa_name(path) << " mode " << static_cast<int>(mode) << " " << dsa::dtype_name(half));
        adam_state got = start;
        std::vector<std::uint16_t> got_half(n);
        dsa::cpu::adam_update(path, got.param.data(), got.m.data(), got.v.data(), g.data(), got_half.data(), half,
                              params, n);
        CHECK(dsa::test::same_bits(got.param, want.param));
        CHECK(dsa::test::same_bits(got.m, want.m));
        CHECK(dsa::test::same_bits(got.v, want.v));
        CHECK(got_half == want_half);
        CHECK(std::isnan(got.param[3]));
      }
    }
  }
}
