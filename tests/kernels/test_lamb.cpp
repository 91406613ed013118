// Tests for kernels/cpu/lamb: kernel vs the double reference, trust-ratio cases worked
// out by hand (clamping both ways, zero norms), the half copy-out, and the update in
// phases over pieces of a tensor (as ZeRO partitions cut it) against the whole.
#include "kernels/cpu/lamb.hpp"

#include "core/half.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/isa_paths.hpp"
#include "tests/support/same_bits.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace {

using dsa::cpu::bias_correction;
using dsa::cpu::lamb_params;

std::vector<float> uniform(std::int64_t n, float lo, float hi, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(n);
  for (auto& e : x) e = u(rng);
  return x;
}

// Two-element LAMB state stepped through the kernel.
struct two {
  float p[2], m[2] = {0, 0}, v[2] = {0, 0}, work[2] = {0, 0};
  float step(float g0, float g1, const lamb_params& params) {
    float g[2] = {g0, g1};
    return dsa::cpu::lamb_update(p, m, v, g, work, nullptr, dsa::dtype::f16, params, 2);
  }
};

lamb_params hand_params() {
  lamb_params params;
  params.lr = 0.01f; // betas (0.9, 0.999), eps 1e-8, max_coeff 10, min_coeff 0.01
  return params;
}

} // namespace

TEST_CASE("lamb: kernel matches the double reference over several steps") {
  for (std::int64_t n : {1, 7, 37, 1031, 16384 * 2 + 9}) {
    for (float wd : {0.0f, 0.01f}) {
      for (bias_correction bc : {bias_correction::on, bias_correction::off}) {
        CAPTURE(n);
        CAPTURE(wd);
        CAPTURE(static_cast<int>(bc));
        auto pk = uniform(n, -1.0f, 1.0f, 11), pr = pk;
        std::vector<float> mk(n, 0.0f), vk(n, 0.0f), mr(n, 0.0f), vr(n, 0.0f), work(n);
        lamb_params params;
        params.lr = 1e-2f;
        params.weight_decay = wd;
        params.correction = bc;
        for (std::int64_t t = 1; t <= 4; ++t) {
          params.step = t;
          auto g = uniform(n, -2.0f, 2.0f, static_cast<std::uint32_t>(20 + t));
          float ck = dsa::cpu::lamb_update(pk.data(), mk.data(), vk.data(), g.data(), work.data(), nullptr,
                                           dsa::dtype::f16, params, n);
          float cr = dsa::cpu::lamb_update_ref(pr.data(), mr.data(), vr.data(), g.data(), params, n);
          DSA_CHECK_CLOSE(&ck, &cr, 1, dsa::test::optimizer_step);
        }
        DSA_CHECK_CLOSE(mk.data(), mr.data(), n, dsa::test::optimizer_step);
        DSA_CHECK_CLOSE(vk.data(), vr.data(), n, dsa::test::optimizer_step);
        DSA_CHECK_CLOSE(pk.data(), pr.data(), n, dsa::test::optimizer_step);
      }
    }
  }
}

TEST_CASE("lamb: two elements, two steps by hand") {
  // lr 0.01, p0 = (3, 4) so ||p0|| = 5; g1 = (1, -1), g2 = (0.5, 0.5); no weight decay.
  lamb_params params = hand_params();
  two s{{3.0f, 4.0f}};
  // Step 1: m = (0.1, -0.1), v = (0.001, 0.001); m_hat = (1, -1), v_hat = (1, 1)
  //   u = (1, -1) / (1 + 1e-8); ||u|| = sqrt(2) / (1 + 1e-8)
  //   coeff = 5 (1 + 1e-8) / sqrt(2) = 3.5355339413, inside [0.01, 10]
  //   p = p0 - 0.01 coeff u = (3, 4) -+ 0.05 / sqrt(2) = (2.9646446609, 4.0353553391)
  params.step = 1;
  float c1 = s.step(1.0f, -1.0f, params);
  CHECK(c1 == doctest::Approx(5.0 * (1 + 1e-8) / std::sqrt(2.0)).epsilon(1e-6));
  const double p1[2] = {3.0 - 0.05 / std::sqrt(2.0), 4.0 + 0.05 / std::sqrt(2.0)};
  CHECK(s.p[0] == doctest::Approx(p1[0]).epsilon(1e-7));
  CHECK(s.p[1] == doctest::Approx(p1[1]).epsilon(1e-7));
  // Step 2: m = 0.9 (0.1, -0.1) + 0.1 (0.5, 0.5) = (0.14, -0.04)
  //   v = 0.999 * 0.001 + 0.001 * 0.25 = 0.001249 (both); 1 - 0.9^2 = 0.19, 1 - 0.999^2 = 0.001999
  //   u_i = (m_i / 0.19) / (sqrt(0.001249 / 0.001999) + 1e-8)
  //   coeff = ||p1|| / ||u|| = 5.1649422865; p2 = p1 - 0.01 coeff u = (2.9164981212, 4.0491114933)
  params.step = 2;
  float c2 = s.step(0.5f, 0.5f, params);
  const double den = std::sqrt(0.001249 / 0.001999) + 1e-8;
  const double u[2] = {0.14 / 0.19 / den, -0.04 / 0.19 / den};
  const double coeff = std::hypot(p1[0], p1[1]) / std::hypot(u[0], u[1]);
  CHECK(coeff == doctest::Approx(5.1649422865).epsilon(1e-9));
  CHECK(c2 == doctest::Approx(coeff).epsilon(1e-6));
  CHECK(s.p[0] == doctest::Approx(p1[0] - 0.01 * coeff * u[0]).epsilon(1e-7));
  CHECK(s.p[1] == doctest::Approx(p1[1] - 0.01 * coeff * u[1]).epsilon(1e-7));
  CHECK(s.p[0] == doctest::Approx(2.9164981212).epsilon(1e-7));
  CHECK(s.p[1] == doctest::Approx(4.0491114933).epsilon(1e-7));
}

TEST_CASE("lamb: weight decay enters the update and its norm") {
  // wd 0.1: u = (1, -1)/(1 + 1e-8) + 0.1 (3, 4) = (1.3, -0.6) (to 1e-8); ||u|| = sqrt(2.05)
  //   coeff = 5 / sqrt(2.05) = 3.4921515112; p = (3, 4) - 0.01 coeff u = (2.9546020307, 4.0209529087)
  lamb_params params = hand_params();
  params.weight_decay = 0.1f;
  params.step = 1;
  two s{{3.0f, 4.0f}};
  float c = s.step(1.0f, -1.0f, params);
  const double u[2] = {1.0 / (1 + 1e-8) + 0.3, -1.0 / (1 + 1e-8) + 0.4};
  const double coeff = 5.0 / std::hypot(u[0], u[1]);
  CHECK(coeff == doctest::Approx(3.4921515112).epsilon(1e-9));
  CHECK(c == doctest::Approx(coeff).epsilon(1e-6));
  CHECK(s.p[0] == doctest::Approx(3.0 - 0.01 * coeff * u[0]).epsilon(1e-7));
  CHECK(s.p[1] == doctest::Approx(4.0 - 0.01 * coeff * u[1]).epsilon(1e-7));
}

TEST_CASE("lamb: bias correction off") {
  // Step 1: u = 0.1 / (sqrt(0.001) + 1e-8) (+-) = 3.1622766 each; coeff = 5 / (sqrt(2) * 3.1622766) = 1.118034
  //   lr * coeff * u = 0.01 * 5 / sqrt(2): the trust ratio makes the step size independent of |u|.
  lamb_params params = hand_params();
  params.correction = bias_correction::off;
  params.step = 1;
  two s{{3.0f, 4.0f}};
  float c = s.step(1.0f, -1.0f, params);
  // f32 betas do not cancel without bias correction: 1 - 0.9f = 0.100000024, 1 - 0.999f = 0.000999987125.
  const double u = (1.0 - double(0.9f)) / (std::sqrt(1.0 - double(0.999f)) + 1e-8);
  CHECK(c == doctest::Approx(5.0 / (std::sqrt(2.0) * u)).epsilon(1e-6));
  CHECK(s.p[0] == doctest::Approx(3.0 - 0.05 / std::sqrt(2.0)).epsilon(1e-7));
  CHECK(s.p[1] == doctest::Approx(4.0 + 0.05 / std::sqrt(2.0)).epsilon(1e-7));
}

TEST_CASE("lamb: trust ratio is clamped and is 1 when a norm is zero") {
  lamb_params params = hand_params();
  params.step = 1;
  SUBCASE("clamped to max_coeff") {
    // ||p|| / ||u|| = 3.54 > max_coeff 2: p = (3, 4) -+ 0.01 * 2 / (1 + 1e-8)
    params.max_coeff = 2.0f;
    two s{{3.0f, 4.0f}};
    CHECK(s.step(1.0f, -1.0f, params) == 2.0f);
    CHECK(s.p[0] == doctest::Approx(3.0 - 0.02 / (1 + 1e-8)).epsilon(1e-7));
    CHECK(s.p[1] == doctest::Approx(4.0 + 0.02 / (1 + 1e-8)).epsilon(1e-7));
  }
  SUBCASE("clamped to min_coeff") {
    // ||p|| = 0.005, ||u|| = 1.414: ratio 0.0035 < min_coeff 0.01: p = (0.003, 0.004) -+ 0.01 * 0.01
    two s{{0.003f, 0.004f}};
    CHECK(s.step(1.0f, -1.0f, params) == 0.01f);
    CHECK(s.p[0] == doctest::Approx(0.003 - 1e-4).epsilon(1e-6));
    CHECK(s.p[1] == doctest::Approx(0.004 + 1e-4).epsilon(1e-6));
  }
  SUBCASE("zero parameter norm") {
    // ||p|| = 0: coeff 1, p = -0.01 u = (-0.01, 0.01) / (1 + 1e-8)
    two s{{0.0f, 0.0f}};
    CHECK(s.step(1.0f, -1.0f, params) == 1.0f);
    CHECK(s.p[0] == doctest::Approx(-0.01).epsilon(1e-7));
    CHECK(s.p[1] == doctest::Approx(0.01).epsilon(1e-7));
  }
  SUBCASE("zero update norm") {
    // g = 0, m = v = 0, wd = 0: u = 0, coeff 1, p unchanged.
    two s{{3.0f, 4.0f}};
    CHECK(s.step(0.0f, 0.0f, params) == 1.0f);
    CHECK(s.p[0] == 3.0f);
    CHECK(s.p[1] == 4.0f);
  }
}

TEST_CASE("lamb: half copy-out equals converting the f32 result") {
  for (dsa::dtype half : {dsa::dtype::f16, dsa::dtype::bf16}) {
    for (std::int64_t n : {1, 13, 1031, 16384 * 2 + 3}) {
      CAPTURE(n);
      CAPTURE(dsa::dtype_name(half));
      auto p = uniform(n, -1.0f, 1.0f, 5), p2 = p;
      auto g = uniform(n, -1.0f, 1.0f, 6);
      std::vector<float> m(n, 0.0f), v(n, 0.0f), m2(n, 0.0f), v2(n, 0.0f), work(n);
      std::vector<std::uint16_t> out(n, 0xdead);
      lamb_params params;
      params.weight_decay = 0.01f;
      float c1 = dsa::cpu::lamb_update(p.data(), m.data(), v.data(), g.data(), work.data(), out.data(), half, params, n);
      float c2 = dsa::cpu::lamb_update(p2.data(), m2.data(), v2.data(), g.data(), work.data(), nullptr, half, params, n);
      CHECK(c1 == c2);
      std::int64_t bad_half = 0, bad_f32 = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t want = half == dsa::dtype::f16 ? dsa::f32_to_f16(p[i]) : dsa::f32_to_bf16(p[i]);
        bad_half += out[i] != want;
        bad_f32 += dsa::float_bits(p[i]) != dsa::float_bits(p2[i]);
      }
      CHECK(bad_half == 0);
      CHECK(bad_f32 == 0);
    }
  }
}

TEST_CASE("lamb: the three phases over block-aligned pieces equal lamb_update, bit for bit") {
  using dsa::cpu::lamb_norm_block;
  const std::int64_t n = 5 * lamb_norm_block + 37;
  // Pieces as ZeRO partitions cut a tensor: at norm-block boundaries, the last one short.
  const std::int64_t cuts[] = {0, lamb_norm_block, 3 * lamb_norm_block, n};
  auto p_whole = uniform(n, -1.0f, 1.0f, 5), p_split = p_whole;
  std::vector<float> m_whole(n, 0.0f), v_whole(n, 0.0f), m_split(n, 0.0f), v_split(n, 0.0f), work(n);
  std::vector<std::uint16_t> half_whole(n), half_split(n);
  lamb_params params;
  params.lr = 1e-2f;
  params.weight_decay = 0.01f;
  for (std::int64_t t = 1; t <= 3; ++t) {
    params.step = t;
    auto g = uniform(n, -2.0f, 2.0f, static_cast<std::uint32_t>(40 + t));
    float whole = dsa::cpu::lamb_update(p_whole.data(), m_whole.data(), v_whole.data(), g.data(), work.data(),
                                        half_whole.data(), dsa::dtype::bf16, params, n);
    // Phase one per piece, the update direction written over the gradient (work == grad).
    std::vector<double> sums(static_cast<std::size_t>(2 * dsa::cpu::lamb_norm_blocks(n)));
    for (int k = 0; k < 3; ++k) {
      const std::int64_t lo = cuts[k], hi = cuts[k + 1];
      dsa::cpu::lamb_first_pass(m_split.data() + lo, v_split.data() + lo, g.data() + lo,
                                sums.data() + 2 * (lo / lamb_norm_block), p_split.data() + lo, g.data() + lo, params,
                                hi - lo);
    }
    double totals[2] = {0.0, 0.0};
    dsa::cpu::lamb_norm_totals(totals, sums.data(), dsa::cpu::lamb_norm_blocks(n));
    const float coeff = dsa::cpu::lamb_trust_ratio(totals[0], totals[1], params);
    CHECK(coeff == whole);
    for (int k = 0; k < 3; ++k) {
      const std::int64_t lo = cuts[k], hi = cuts[k + 1];
      dsa::cpu::lamb_second_pass(p_split.data() + lo, half_split.data() + lo, g.data() + lo, dsa::dtype::bf16, coeff,
                                 params, hi - lo);
    }
  }
  CHECK(p_split == p_whole);
  CHECK(m_split == m_whole);
  CHECK(v_split == v_whole);
  CHECK(half_split == half_whole);
}

TEST_CASE("lamb: the AVX-512 path gives the AVX2 path's bits; the scalar path agrees within rounding") {
  // A tail of 13 (a group of 8 on the vector paths, then 5), several norm blocks, tiny sizes.
  for (std::int64_t n : {std::int64_t{5}, std::int64_t{37}, 3 * dsa::cpu::lamb_norm_block + 16 * 7 + 13}) {
    for (dsa::dtype half : {dsa::dtype::f16, dsa::dtype::bf16}) {
      lamb_params params;
      params.lr = 0.01f;
      params.weight_decay = 0.02f;
      params.step = 3;
      const auto g = uniform(n, -1.0f, 1.0f, 41);
      const auto p0 = uniform(n, -1.0f, 1.0f, 42);
      const auto m0 = uniform(n, -0.1f, 0.1f, 43);
      const auto v0 = uniform(n, 0.0f, 0.01f, 44);
      struct result {
        std::vector<float> p, m, v;
        std::vector<std::uint16_t> h;
        float coeff;
      };
      auto run = [&](dsa::cpu::isa path) {
        result r{p0, m0, v0, std::vector<std::uint16_t>(n), 0.0f};
        std::vector<float> work(n);
        r.coeff = dsa::cpu::lamb_update(path, r.p.data(), r.m.data(), r.v.data(), g.data(), work.data(), r.h.data(),
                                        half, params, n);
        return r;
      };
      const result scalar = run(dsa::cpu::isa::scalar);
      std::vector<float> ref_p = p0, ref_m = m0, ref_v = v0;
      const float ref_coeff = dsa::cpu::lamb_update_ref(ref_p.data(), ref_m.data(), ref_v.data(), g.data(), params, n);
      for (dsa::cpu::isa path : dsa::test::isa_paths()) {
        INFO(dsa::cpu::isa_name(path) << " n " << n);
        const result r = run(path);
        // Every path against the double reference; the vector paths bit for bit with each other.
        DSA_CHECK_CLOSE(r.p.data(), ref_p.data(), n, dsa::test::f32_kernel);
        DSA_CHECK_CLOSE(&r.coeff, &ref_coeff, 1, dsa::test::f32_kernel);
        CHECK(dsa::test::same_bits(r.m, scalar.m)); // the moments are element-wise: the same bits everywhere
        CHECK(dsa::test::same_bits(r.v, scalar.v));
#if defined(__AVX2__) // a baseline build's avx2 path is the scalar code, with its own norm order
        if (path == dsa::cpu::isa::avx512) {
          const result avx2 = run(dsa::cpu::isa::avx2);
          CHECK(dsa::test::same_bits(r.p, avx2.p));
          CHECK(r.h == avx2.h);
          CHECK(r.coeff == avx2.coeff);
          // The norms' block sums themselves (the float trust ratio could hide their last bits).
          auto sums = [&](dsa::cpu::isa on) {
            std::vector<float> m = m0, v = v0, work(n);
            std::vector<double> block_sums(static_cast<std::size_t>(2 * dsa::cpu::lamb_norm_blocks(n)));
            dsa::cpu::lamb_first_pass(on, m.data(), v.data(), work.data(), block_sums.data(), p0.data(), g.data(),
                                      params, n);
            return block_sums;
          };
          CHECK(sums(path) == sums(dsa::cpu::isa::avx2));
        }
#endif
      }
    }
  }
}
