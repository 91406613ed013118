// The host/device math of kernels/common (the arithmetic the CUDA kernels run) against
// the CPU kernels and their double references, so it is tested on every machine.
#include "kernels/common/adam_math.hpp"
#include "kernels/common/dropout_math.hpp"
#include "kernels/common/gelu_math.hpp"
#include "kernels/common/layernorm_math.hpp"
#include "kernels/common/residual_layernorm_math.hpp"
#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/adam.hpp"
#include "kernels/cpu/bias.hpp"
#include "kernels/cpu/dropout.hpp"
#include "kernels/cpu/layernorm.hpp"

#include "tests/support/compare.hpp"
#include "tests/support/random.hpp"
#include "tests/support/tolerances.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

using namespace dsa;
using test::random_vector;

namespace {

// The order in which a CUDA block of `threads` threads merges Welford partials
// (kernels/cuda/device_math.cuh): each thread strides over the row, lanes of a warp
// merge in an xor butterfly, then warp 0's view of the per-warp totals in order.
common::welford block_order_welford(const float* x, std::int64_t c, int threads) {
  std::vector<common::welford> part(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t)
    for (std::int64_t j = t; j < c; j += threads)
      part[static_cast<std::size_t>(t)] =
          common::welford_add(part[static_cast<std::size_t>(t)], x[j]);
  for (int w = 0; w < threads / 32; ++w) {
    common::welford* lanes = part.data() + w * 32;
    for (int o = 16; o > 0; o >>= 1) {
      std::vector<common::welford> next(lanes, lanes + 32);
      for (int l = 0; l < 32; ++l)
        next[static_cast<std::size_t>(l)] = common::welford_merge(lanes[l], lanes[l ^ o]);
      std::copy(next.begin(), next.end(), lanes);
    }
  }
  common::welford total;
  for (int w = 0; w < threads / 32; ++w)
    total = common::welford_merge(total, part[static_cast<std::size_t>(w * 32)]);
  return total;
}

} // namespace

TEST_CASE("common gelu matches the CPU kernels and the double reference") {
  for (std::int64_t n : {1, 13, 1031}) {
    CAPTURE(n);
    auto x = random_vector(n, -6.0f, 6.0f, 11);
    std::vector<float> ref(x.size()), cpu(x.size()), shared(x.size());
    cpu::gelu_forward_ref(ref.data(), x.data(), n);
    cpu::gelu_forward(cpu.data(), x.data(), n);
    for (std::size_t i = 0; i < x.size(); ++i)
      shared[i] = common::gelu_value(x[i]);
    DSA_CHECK_CLOSE(shared.data(), ref.data(), n, test::f32_kernel);
    DSA_CHECK_CLOSE(shared.data(), cpu.data(), n, test::f32_kernel);

    auto dy = random_vector(n, -1.0f, 1.0f, 12);
    cpu::gelu_backward_ref(ref.data(), dy.data(), x.data(), n);
    for (std::size_t i = 0; i < x.size(); ++i)
      shared[i] = dy[i] * common::gelu_derivative(x[i]);
    DSA_CHECK_CLOSE(shared.data(), ref.data(), n, test::f32_kernel);
  }
}

TEST_CASE("common bias+gelu equals bias_add then gelu") {
  const std::int64_t rows = 7, c = 37;
  auto x = random_vector(rows * c, -4.0f, 4.0f, 21);
  auto bias = random_vector(c, -1.0f, 1.0f, 22);
  auto dy = random_vector(rows * c, -1.0f, 1.0f, 23);
  std::vector<float> biased = x, ref(x.size()), dref(x.size()), fused(x.size()), dfused(x.size());
  cpu::bias_add(biased.data(), bias.data(), rows, c);
  cpu::gelu_forward_ref(ref.data(), biased.data(), rows * c);
  cpu::gelu_backward_ref(dref.data(), dy.data(), biased.data(), rows * c);
  for (std::int64_t i = 0; i < rows * c; ++i) {
    const auto k = static_cast<std::size_t>(i);
    fused[k] = common::bias_gelu_forward_element(x[k], bias[static_cast<std::size_t>(i % c)]);
    dfused[k] =
        common::bias_gelu_backward_element(dy[k], x[k], bias[static_cast<std::size_t>(i % c)]);
  }
  DSA_CHECK_CLOSE(fused.data(), ref.data(), rows * c, test::f32_kernel);
  DSA_CHECK_CLOSE(dfused.data(), dref.data(), rows * c, test::f32_kernel);
}

TEST_CASE("welford merged in the CUDA block order gives the row statistics") {
  for (std::int64_t c : {1, 31, 769, 4099}) {
    CAPTURE(c);
    auto x = random_vector(c, 2.0f, 3.0f, 31); // an offset mean: the case naive sums lose
    double m = 0.0, v = 0.0;
    for (float e : x)
      m += e;
    m /= static_cast<double>(c);
    for (float e : x)
      v += (e - m) * (e - m);
    v /= static_cast<double>(c);
    const common::welford w = block_order_welford(x.data(), c, 256);
    CHECK(w.count == static_cast<float>(c));
    const float mean = w.mean, var = w.m2 / w.count;
    const double ref_mean = m, ref_var = v;
    DSA_CHECK_CLOSE(&mean, &ref_mean, 1, test::f32_kernel);
    DSA_CHECK_CLOSE(&var, &ref_var, 1, test::f32_kernel);
  }
}

TEST_CASE("common layernorm rows match the double reference") {
  for (std::int64_t c : {1, 7, 769, 1024}) {
    CAPTURE(c);
    const std::int64_t rows = 5;
    const float eps = 1e-12f;
    auto x = random_vector(rows * c, -2.0f, 2.0f, 41);
    auto gamma = random_vector(c, 0.5f, 1.5f, 42);
    auto beta = random_vector(c, -0.5f, 0.5f, 43);
    auto dy = random_vector(rows * c, -1.0f, 1.0f, 44);
    const auto n = static_cast<std::size_t>(rows * c);
    std::vector<float> y(n), y_ref(n), mean(rows), rstd(rows), mean_ref(rows), rstd_ref(rows);
    cpu::layernorm_forward_ref(y_ref.data(), mean_ref.data(), rstd_ref.data(), x.data(),
                               gamma.data(), beta.data(), eps, rows, c);
    for (std::int64_t r = 0; r < rows; ++r)
      common::layernorm_row_forward(y.data() + r * c, &mean[static_cast<std::size_t>(r)],
                                    &rstd[static_cast<std::size_t>(r)], x.data() + r * c,
                                    gamma.data(), beta.data(), eps, c);
    if (c > 1) { // c == 1: every output is beta and rstd is 1/sqrt(eps), compared below
      DSA_CHECK_CLOSE(rstd.data(), rstd_ref.data(), rows, test::f32_kernel);
    }
    DSA_CHECK_CLOSE(mean.data(), mean_ref.data(), rows, test::f32_kernel);
    DSA_CHECK_CLOSE(y.data(), y_ref.data(), rows * c, test::f32_kernel);

    std::vector<float> dx(n), dx_ref(n), dg(static_cast<std::size_t>(c), 0.0f), db(dg), dg_ref(dg),
        db_ref(dg);
    cpu::layernorm_backward_ref(dx_ref.data(), dg_ref.data(), db_ref.data(), dy.data(), x.data(),
                                mean_ref.data(), rstd_ref.data(), gamma.data(), rows, c);
    for (std::int64_t r = 0; r < rows; ++r)
      common::layernorm_row_backward(dx.data() + r * c, dg.data(), db.data(), dy.data() + r * c,
                                     x.data() + r * c, mean_ref[static_cast<std::size_t>(r)],
                                     rstd_ref[static_cast<std::size_t>(r)], gamma.data(), c);
    if (c > 1) {
      DSA_CHECK_CLOSE(dx.data(), dx_ref.data(), rows * c, test::f32_kernel);
      DSA_CHECK_CLOSE(dg.data(), dg_ref.data(), c, test::f32_kernel);
    }
    DSA_CHECK_CLOSE(db.data(), db_ref.data(), c, test::f32_kernel);
  }
}

TEST_CASE("common adam element is the CPU kernel's arithmetic, bit for bit") {
  for (auto mode : {cpu::adam_mode::adam, cpu::adam_mode::adamw}) {
    for (std::int64_t n : {1, 13, 1000}) {
      CAPTURE(n);
      cpu::adam_params params;
      params.lr = 1e-3f;
      params.weight_decay = 0.01f;
      params.mode = mode;
      auto p_cpu = random_vector(n, -1.0f, 1.0f, 51);
      std::vector<float> m_cpu(static_cast<std::size_t>(n), 0.0f), v_cpu(m_cpu);
      auto p_sh = p_cpu, m_sh = m_cpu, v_sh = v_cpu, p_ref = p_cpu, m_ref = m_cpu, v_ref = v_cpu;
      for (std::int64_t step = 1; step <= 3; ++step) {
        params.step = step;
        auto g = random_vector(n, -0.1f, 0.1f, static_cast<std::uint32_t>(60 + step));
        cpu::adam_update(p_cpu.data(), m_cpu.data(), v_cpu.data(), g.data(), nullptr, dtype::f16,
                         params, n);
        cpu::adam_update_ref(p_ref.data(), m_ref.data(), v_ref.data(), g.data(), params, n);
        const common::adam_consts c = cpu::make_adam_consts(params);
        for (std::size_t i = 0; i < g.size(); ++i)
          common::adam_element(p_sh[i], m_sh[i], v_sh[i], g[i], c);
      }
      CHECK(std::memcmp(p_sh.data(), p_cpu.data(), p_sh.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(m_sh.data(), m_cpu.data(), m_sh.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(v_sh.data(), v_cpu.data(), v_sh.size() * sizeof(float)) == 0);
      DSA_CHECK_CLOSE(p_sh.data(), p_ref.data(), n, test::optimizer_step);
    }
  }
}

TEST_CASE("common finite check tells inf and NaN from large finite values") {
  CHECK(common::is_finite_value(0.0f));
  CHECK(common::is_finite_value(std::numeric_limits<float>::max()));
  CHECK(common::is_finite_value(-std::numeric_limits<float>::denorm_min()));
  CHECK_FALSE(common::is_finite_value(std::numeric_limits<float>::infinity()));
  CHECK_FALSE(common::is_finite_value(-std::numeric_limits<float>::infinity()));
  CHECK_FALSE(common::is_finite_value(std::numeric_limits<float>::quiet_NaN()));
}

TEST_CASE("common dropout draws the CPU kernel's mask and values, bit for bit") {
  philox_stream rng;
  rng.seed = 0x1234567887654321ull;
  rng.step = 3;
  rng.layer = 5;
  rng.site = 2;
  for (float p : {0.0f, 0.1f, 0.5f}) {
    for (std::int64_t n : {1, 7, 4099}) {
      CAPTURE(p);
      CAPTURE(n);
      auto x = random_vector(n, -3.0f, 3.0f, 71);
      x[0] = std::numeric_limits<float>::infinity(); // a dropped inf must give 0, not NaN
      const auto nn = static_cast<std::size_t>(n);
      std::vector<float> y_cpu(nn), y_sh(nn);
      std::vector<std::uint8_t> mask_cpu(nn), mask_sh(nn);
      cpu::dropout_forward(y_cpu.data(), mask_cpu.data(), x.data(), p, rng, n);
      // The CUDA kernel's loop: one Philox block of four elements per thread.
      const float scale = 1.0f / (1.0f - p);
      for (std::int64_t b = 0; b < (n + 3) / 4; ++b) {
        const auto u = rng.uniform4(static_cast<std::uint32_t>(b));
        for (int k = 0; k < 4 && 4 * b + k < n; ++k) {
          const auto i = static_cast<std::size_t>(4 * b + k);
          const bool keep = common::dropout_keep(u, k, p);
          y_sh[i] = common::dropout_apply(x[i], keep, scale);
          mask_sh[i] = keep ? 1 : 0;
        }
      }
      CHECK(mask_sh == mask_cpu);
      CHECK(std::memcmp(y_sh.data(), y_cpu.data(), nn * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("common residual layernorm row equals bias_add, dropout, residual add and layernorm") {
  philox_stream rng;
  rng.seed = 99;
  rng.layer = 4;
  rng.site = 1;
  for (std::int64_t c : {7, 769}) {
    CAPTURE(c);
    const std::int64_t rows = 5;
    const auto nn = static_cast<std::size_t>(rows * c);
    const float p = 0.1f, eps = 1e-12f;
    const auto x = random_vector(rows * c, -2.0f, 2.0f, 81),
               residual = random_vector(rows * c, -1.0f, 1.0f, 82);
    const auto bias = random_vector(c, -0.5f, 0.5f, 83), gamma = random_vector(c, 0.5f, 1.5f, 84);
    const auto beta = random_vector(c, -0.5f, 0.5f, 85);
    // The composition of the CPU kernels, in the order the BERT layer runs them.
    std::vector<float> v_ref = x, y_ref(nn), mean_ref(static_cast<std::size_t>(rows)),
                       rstd_ref(mean_ref);
    cpu::bias_add(v_ref.data(), bias.data(), rows, c);
    cpu::dropout_forward(v_ref.data(), nullptr, v_ref.data(), p, rng, rows * c);
    for (std::size_t i = 0; i < nn; ++i)
      v_ref[i] += residual[i];
    cpu::layernorm_forward_ref(y_ref.data(), mean_ref.data(), rstd_ref.data(), v_ref.data(),
                               gamma.data(), beta.data(), eps, rows, c);
    std::vector<float> v(nn), y(nn), mean(mean_ref.size()), rstd(mean_ref.size());
    for (std::int64_t r = 0; r < rows; ++r)
      common::residual_layernorm_row_forward(
          y.data() + r * c, v.data() + r * c, &mean[static_cast<std::size_t>(r)],
          &rstd[static_cast<std::size_t>(r)], x.data() + r * c, bias.data(),
          residual.data() + r * c, gamma.data(), beta.data(), p, rng,
          static_cast<std::uint64_t>(r * c), eps, c);
    // The shared form fuses the scale and the residual add into one fma: one rounding less.
    DSA_CHECK_CLOSE(v.data(), v_ref.data(), rows * c, test::f32_kernel);
    for (std::size_t i = 0; i < nn; ++i)
      CHECK((v[i] == residual[i]) == (v_ref[i] == residual[i]));
    DSA_CHECK_CLOSE(y.data(), y_ref.data(), rows * c, test::f32_kernel);
    DSA_CHECK_CLOSE(mean.data(), mean_ref.data(), rows, test::f32_kernel);
    DSA_CHECK_CLOSE(rstd.data(), rstd_ref.data(), rows, test::f32_kernel);
  }
}
