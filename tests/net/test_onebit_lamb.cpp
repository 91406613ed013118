// 1-bit LAMB (optim/onebit_lamb.hpp) over the compressed allreduce: the warm-up is LAMB
// without bias correction with each tensor's clamped trust coefficient averaged into its
// frozen one; once frozen, one compressed exchange of the scaled momentum per step, the
// variance frozen, factors kept in their bounds, every rank identical bit for bit; on a
// noisy quadratic it converges, if less closely than LAMB.
#include "io/net/compressed_allreduce.hpp"
#include "optim/onebit_lamb.hpp"
#include "tests/net/net_support.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace dsa::test {
namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const std::vector<std::int64_t> tensor_sizes = {40, 7, 81}; // three tensors, awkward sizes

} // namespace

TEST_CASE("1-bit LAMB: the warm-up is LAMB without bias correction, trust coefficients clamped and averaged") {
  optim::onebit_lamb_params p;
  p.lr = 0.01f;
  p.weight_decay = 0.01f;
  p.freeze_step = 100;
  p.max_coeff = 0.3f;
  optim::onebit_lamb opt(p, tensor_sizes);
  const std::int64_t n = opt.numel();
  auto param = random_vector(n, -1.0f, 1.0f, 3);
  std::vector<double> ref(param.begin(), param.end()), m(n, 0.0), v(n, 0.0), coeff(3, 0.0);
  for (int k = 0; k < 3; ++k) {
    const auto g = random_vector(n, -1.0f, 1.0f, static_cast<std::uint32_t>(20 + k));
    REQUIRE(opt.step(param.data(), g.data(), [](float*, std::int64_t) -> status {
      return make_error(errc::runtime, "no exchange while warming up");
    }).has_value());
    std::int64_t off = 0;
    for (std::size_t t = 0; t < tensor_sizes.size(); ++t) {
      std::vector<double> u(static_cast<std::size_t>(tensor_sizes[t]));
      double pn = 0, un = 0;
      for (std::int64_t i = 0; i < tensor_sizes[t]; ++i) {
        const auto j = static_cast<std::size_t>(off + i);
        m[j] = 0.9 * m[j] + 0.1 * g[j];
        v[j] = 0.999 * v[j] + 0.001 * g[j] * g[j];
        u[static_cast<std::size_t>(i)] = m[j] / (std::sqrt(v[j]) + 1e-8) + 0.01 * ref[j];
        pn += ref[j] * ref[j];
        un += u[static_cast<std::size_t>(i)] * u[static_cast<std::size_t>(i)];
      }
      const double c = std::clamp(std::sqrt(pn) / std::sqrt(un), 0.01, 0.3);
      if (c != 1.0) coeff[t] = 0.9 * coeff[t] + 0.1 * c;
      for (std::int64_t i = 0; i < tensor_sizes[t]; ++i)
        ref[static_cast<std::size_t>(off + i)] -= 0.01 * c * u[static_cast<std::size_t>(i)];
      off += tensor_sizes[t];
    }
  }
  for (std::int64_t i = 0; i < n; ++i)
    CHECK(param[static_cast<std::size_t>(i)] == doctest::Approx(ref[static_cast<std::size_t>(i)]).epsilon(1e-5));
  for (std::size_t t = 0; t < 3; ++t) CHECK(opt.frozen_coefficients()[t] == doctest::Approx(coeff[t]).epsilon(1e-5));
  CHECK_FALSE(opt.compressed_next());
}

TEST_CASE("1-bit LAMB: once frozen, one compressed exchange per step, variance frozen, factors bounded; the ranks "
          "stay identical") {
  constexpr int ranks = 4, steps = 15;
  optim::onebit_lamb_params p;
  p.lr = 0.01f;
  p.freeze_step = 6;
  std::vector<std::vector<float>> params(ranks);
  std::vector<int> exchanges(ranks, 0);
  run_ranks(ranks, [&](net::transport& t, int r) {
    net::communicator comm(t);
    net::onebit_errors errors;
    optim::onebit_lamb opt(p, tensor_sizes);
    const std::int64_t n = opt.numel();
    std::vector<float> mask(static_cast<std::size_t>(n), 1.0f);
    mask[0] = 0.0f;
    REQUIRE(opt.set_mask(mask).has_value());
    auto param = random_vector(n, -1.0f, 1.0f, 9);
    std::vector<float> frozen_v, frozen_coeff, factors(3, 1.0f);
    for (int k = 1; k <= steps; ++k) {
      auto g = random_vector(n, -1.0f, 1.0f, static_cast<std::uint32_t>(100 * k + r));
      if (!opt.compressed_next()) {
        REQUIRE(comm.allreduce_sum(g.data(), dtype::f32, n).has_value());
        for (auto& x : g) x /= ranks;
      }
      const bool compressed = opt.compressed_next();
      REQUIRE(opt.step(param.data(), g.data(), [&](float* values, std::int64_t count) -> status {
        ++exchanges[static_cast<std::size_t>(r)];
        CHECK(count == n); // one exchange over every tensor's momentum
        auto report = net::compressed_allreduce(comm, values, count, errors);
        if (!report) return report.err();
        return {};
      }).has_value());
      if (k == p.freeze_step) {
        frozen_v = opt.exp_avg_sq();
        frozen_coeff = opt.frozen_coefficients();
      }
      if (compressed) {
        CHECK(same_bits(opt.exp_avg_sq(), frozen_v));
        CHECK(same_bits(opt.frozen_coefficients(), frozen_coeff));
        CHECK(opt.exp_avg()[0] == 0.0f); // masked
        for (std::size_t t = 0; t < 3; ++t) {
          const float f = opt.last_factors()[t];
          CHECK(f >= p.factor_min);
          CHECK(f <= p.factor_max);
          CHECK(f >= factors[t] * (1 - p.factor_threshold) * (1 - 1e-6f));
          CHECK(f <= factors[t] * (1 + p.factor_threshold) * (1 + 1e-6f));
          factors[t] = f;
        }
      }
    }
    params[static_cast<std::size_t>(r)] = param;
  });
  for (int r = 0; r < ranks; ++r) {
    CHECK(exchanges[static_cast<std::size_t>(r)] == steps - p.freeze_step);
    CHECK(same_bits(params[static_cast<std::size_t>(r)], params[0]));
  }
}

TEST_CASE("1-bit LAMB: compressed steps equal a double reference of DeepSpeed's algorithm, with per-tensor decay") {
  // The exchange is replaced by a known transform, so the test sees what goes in (the
  // scaled momentum) and checks everything after it: unscaling, the mask, the fresh
  // variance, the factor's weight-decay branch (bounds wide enough not to clamp it) and the
  // update on the frozen coefficient.
  optim::onebit_lamb_params p;
  p.lr = 0.01f;
  p.freeze_step = 2;
  p.factor_min = 1e-3f, p.factor_max = 1e3f, p.factor_threshold = 100.0f;
  const std::vector<float> decays = {0.05f, 0.0f, 0.02f};
  optim::onebit_lamb opt(p, tensor_sizes, decays);
  const std::int64_t n = opt.numel();
  std::vector<float> mask(static_cast<std::size_t>(n), 1.0f);
  mask[3] = mask[50] = 0.0f;
  REQUIRE(opt.set_mask(mask).has_value());
  auto param = random_vector(n, -1.0f, 1.0f, 5);
  auto no_exchange = [](float*, std::int64_t) -> status { return make_error(errc::runtime, "warming up"); };
  for (int k = 1; k <= 2; ++k) {
    const auto g = random_vector(n, -1.0f, 1.0f, static_cast<std::uint32_t>(40 + k));
    REQUIRE(opt.step(param.data(), g.data(), no_exchange).has_value());
  }
  REQUIRE(opt.compressed_next());
  // The reference starts from the state the warm-up left (its arithmetic is tested above).
  std::vector<double> ref(param.begin(), param.end()), m(opt.exp_avg().begin(), opt.exp_avg().end());
  const std::vector<double> v(opt.exp_avg_sq().begin(), opt.exp_avg_sq().end());
  std::vector<double> fresh = v, factors(3, 1.0);
  const std::vector<float> coeff = opt.frozen_coefficients();
  std::vector<double> scaling(3);
  double mean = 0;
  for (std::size_t t = 0, off = 0; t < 3; off += static_cast<std::size_t>(tensor_sizes[t]), ++t) {
    double sq = 0;
    for (std::int64_t i = 0; i < tensor_sizes[t]; ++i) sq += m[off + static_cast<std::size_t>(i)] * m[off + static_cast<std::size_t>(i)];
    scaling[t] = std::sqrt(sq / static_cast<double>(tensor_sizes[t]));
    mean += scaling[t] / 3.0;
  }
  for (auto& s : scaling) s = mean / s;
  CHECK(std::abs(scaling[0] - 1.0) + std::abs(scaling[1] - 1.0) > 0.01); // the scalings do something
  for (int k = 3; k <= 5; ++k) {
    const auto g = random_vector(n, -1.0f, 1.0f, static_cast<std::uint32_t>(40 + k));
    std::vector<double> sent(static_cast<std::size_t>(n)), got(static_cast<std::size_t>(n));
    int calls = 0;
    REQUIRE(opt.step(param.data(), g.data(), [&](float* values, std::int64_t count) -> status {
      ++calls;
      REQUIRE(count == n);
      for (std::int64_t i = 0; i < n; ++i) {
        const auto j = static_cast<std::size_t>(i);
        sent[j] = values[j];
        values[j] = 0.75f * values[j] + 0.01f * std::sin(static_cast<float>(i + k)); // "the average"
        got[j] = values[j];
      }
      return {};
    }).has_value());
    CHECK(calls == 1);
    const std::vector<double> previous = m;
    for (std::size_t t = 0, off = 0; t < 3; off += static_cast<std::size_t>(tensor_sizes[t]), ++t) {
      const auto size = static_cast<std::size_t>(tensor_sizes[t]);
      double largest = 0, u0_sq = 0, u_sq = 0;
      std::vector<double> u(size);
      for (std::size_t i = 0; i < size; ++i) {
        const std::size_t j = off + i;
        CHECK(sent[j] == doctest::Approx((0.9 * previous[j] + 0.1 * g[j]) * scaling[t]).epsilon(1e-5));
        m[j] = got[j] / scaling[t] * mask[j];
        const double implied = (m[j] - 0.9 * previous[j]) / 0.1;
        fresh[j] = 0.999 * fresh[j] + 0.001 * implied * implied;
        const double den = std::sqrt(v[j]) + 1e-8, u0 = m[j] / den;
        u[i] = u0 + decays[t] * ref[j];
        largest = std::max(largest, den / (std::sqrt(fresh[j]) + 1e-8));
        u0_sq += u0 * u0;
        u_sq += u[i] * u[i];
      }
      double f = largest;
      if (decays[t] > 0) {
        const double r = std::min(1.0, std::sqrt(u0_sq) / std::sqrt(u_sq));
        f = f * r + (1 - r);
      }
      factors[t] = f;
      CHECK(opt.last_factors()[t] == doctest::Approx(f).epsilon(1e-4));
      for (std::size_t i = 0; i < size; ++i) ref[off + i] -= 0.01 * coeff[t] * f * u[i];
    }
    CHECK(std::abs(factors[0] - factors[1]) > 1e-4); // one factor per tensor
    for (std::int64_t i = 0; i < n; ++i) {
      const auto j = static_cast<std::size_t>(i);
      CHECK(opt.exp_avg()[j] == doctest::Approx(m[j]).epsilon(1e-5));
      CHECK(param[j] == doctest::Approx(ref[j]).epsilon(1e-5));
    }
    CHECK(opt.exp_avg()[3] == 0.0f);
  }
}

TEST_CASE("1-bit LAMB with dummy_first_step: step 1 exchanges zeros once and moves nothing; then it is the run "
          "without it one step later, bias corrections included") {
  optim::onebit_lamb_params p;
  p.lr = 0.01f;
  p.weight_decay = 0.01f;
  p.freeze_step = 100;
  p.bias_correction = true;
  optim::onebit_lamb_params q = p;
  q.dummy_first_step = true;
  optim::onebit_lamb plain(p, tensor_sizes), dummy(q, tensor_sizes);
  const std::int64_t n = plain.numel();
  auto x = random_vector(n, -1.0f, 1.0f, 3), y = x;
  const auto start = y;
  int calls = 0;
  const auto g1 = random_vector(n, -1.0f, 1.0f, 19);
  REQUIRE(dummy.step(y.data(), g1.data(), [&](float* values, std::int64_t count) -> status {
    ++calls;
    CHECK(count == n);
    for (std::int64_t i = 0; i < count; ++i) CHECK(values[i] == 0.0f);
    return {};
  }).has_value());
  CHECK(calls == 1);
  CHECK(same_bits(y, start));
  CHECK(dummy.step_count() == 1);
  CHECK_FALSE(dummy.compressed_next());
  auto no_exchange = [](float*, std::int64_t) -> status { return make_error(errc::runtime, "warming up"); };
  for (int k = 0; k < 4; ++k) {
    const auto g = random_vector(n, -1.0f, 1.0f, static_cast<std::uint32_t>(60 + k));
    REQUIRE(plain.step(x.data(), g.data(), no_exchange).has_value());
    REQUIRE(dummy.step(y.data(), g.data(), no_exchange).has_value());
    CHECK(same_bits(x, y));
  }
}

TEST_CASE("1-bit LAMB: on a noisy quadratic over 4 ranks it converges, within three times LAMB's distance") {
  constexpr int ranks = 4, steps = 400;
  optim::onebit_lamb_params p;
  p.lr = 0.01f;
  p.max_coeff = 1.0f;
  const std::int64_t n = 128;
  const std::vector<std::int64_t> sizes = {64, 48, 16};
  auto target = random_vector(n, -1.0f, 1.0f, 79);
  for (std::int64_t i = 64; i < 112; ++i) target[static_cast<std::size_t>(i)] *= 0.1f; // a tensor of another scale
  auto distance = [&](const std::vector<float>& param) {
    double d = 0;
    for (std::size_t j = 0; j < param.size(); ++j) d += std::pow(param[j] - target[j], 2);
    return std::sqrt(d / static_cast<double>(n));
  };
  auto run = [&](std::int64_t freeze_step, int r, net::communicator& comm) {
    optim::onebit_lamb_params q = p;
    q.freeze_step = freeze_step;
    optim::onebit_lamb opt(q, sizes);
    net::onebit_errors errors;
    std::vector<float> param(static_cast<std::size_t>(n), 0.5f);
    for (int k = 1; k <= steps; ++k) {
      auto noise = random_vector(n, -0.5f, 0.5f, static_cast<std::uint32_t>(7919 * k + r));
      std::vector<float> g(static_cast<std::size_t>(n));
      for (std::size_t j = 0; j < g.size(); ++j) g[j] = param[j] - (target[j] + noise[j]);
      if (!opt.compressed_next()) {
        REQUIRE(comm.allreduce_sum(g.data(), dtype::f32, n).has_value());
        for (auto& x : g) x /= ranks;
      }
      REQUIRE(opt.step(param.data(), g.data(), [&](float* values, std::int64_t count) -> status {
        auto report = net::compressed_allreduce(comm, values, count, errors);
        if (!report) return report.err();
        return {};
      }).has_value());
    }
    return distance(param);
  };
  std::vector<double> lamb(ranks), onebit(ranks);
  run_ranks(ranks, [&](net::transport& t, int r) {
    net::communicator comm(t);
    lamb[static_cast<std::size_t>(r)] = run(steps + 1, r, comm);
    onebit[static_cast<std::size_t>(r)] = run(steps / 5, r, comm);
  });
  // Measured: LAMB 0.021, 1-bit LAMB 0.064 (from 0.55 at the start; the frozen variance and
  // coefficients cost on this noisy toy).
  INFO("LAMB " << lamb[0] << ", 1-bit LAMB " << onebit[0]);
  CHECK(lamb[0] < 0.3);
  CHECK(onebit[0] < 3.0 * lamb[0] + 0.03);
  for (double d : onebit) CHECK(d == onebit[0]);
}

} // namespace dsa::test
