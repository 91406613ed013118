// LayerNorm kernels vs the double reference, backward vs finite differences, the
// invertible backward vs the usual one, aliasing and run-to-run determinism.
#include "kernels/cpu/layernorm.hpp"
#include "kernels/cpu/bias.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/dropout.hpp"

#include "tests/support/compare.hpp"
#include "tests/support/isa_paths.hpp"
#include "tests/support/random.hpp"
#include "tests/support/same_bits.hpp"
#include "tests/support/finite_diff.hpp"
#include "tests/support/tolerances.hpp"

#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

using namespace dsa;
using dsa::test::tolerance;

namespace {

using test::random_vector;

// gamma away from zero with both signs, as backward_from_output requires.
std::vector<float> random_gamma(std::int64_t c, std::uint32_t seed) {
  auto g = random_vector(c, 0.5f, 1.5f, seed);
  for (std::size_t j = 0; j < g.size(); j += 3)
    g[j] = -g[j];
  return g;
}

// sum(dy * layernorm(x)) entirely in double: the objective for finite differences.
double objective(const std::vector<double>& x, const std::vector<double>& gamma,
                 const std::vector<double>& beta, const std::vector<double>& dy, double eps,
                 std::int64_t rows, std::int64_t c) {
  double total = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data() + r * c;
    double m = 0.0, v = 0.0;
    for (std::int64_t j = 0; j < c; ++j)
      m += xr[j];
    m /= static_cast<double>(c);
    for (std::int64_t j = 0; j < c; ++j)
      v += (xr[j] - m) * (xr[j] - m);
    const double s = 1.0 / std::sqrt(v / static_cast<double>(c) + eps);
    for (std::int64_t j = 0; j < c; ++j)
      total += dy[static_cast<std::size_t>(r * c + j)] *
               ((xr[j] - m) * s * gamma[static_cast<std::size_t>(j)] +
                beta[static_cast<std::size_t>(j)]);
  }
  return total;
}

std::vector<double> to_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

struct sizes {
  std::int64_t rows, c;
};
const sizes awkward[] = {{1, 1}, {3, 1}, {1, 7}, {5, 37}, {67, 100}, {13, 769}, {4, 1024}};

} // namespace

TEST_CASE("layernorm: forward matches the double reference at awkward sizes, on every path") {
  const float eps = 1e-12f; // BERT's
  for (cpu::isa path : test::isa_paths())
  for (auto [rows, c] : awkward) {
    CAPTURE(cpu::isa_name(path));
    CAPTURE(rows);
    CAPTURE(c);
    const auto x = random_vector(rows * c, -2.0f, 4.0f, 1);
    const auto gamma = random_gamma(c, 2), beta = random_vector(c, -0.5f, 0.5f, 3);
    std::vector<float> y(x.size()), mean(rows), rstd(rows), y_ref(x.size()), mean_ref(rows),
        rstd_ref(rows);
    cpu::layernorm_forward(path, y.data(), mean.data(), rstd.data(), x.data(), gamma.data(), beta.data(),
                           eps, rows, c);
    cpu::layernorm_forward_ref(y_ref.data(), mean_ref.data(), rstd_ref.data(), x.data(),
                               gamma.data(), beta.data(), eps, rows, c);
    DSA_CHECK_CLOSE(y.data(), y_ref.data(), rows * c, test::f32_kernel);
    DSA_CHECK_CLOSE(mean.data(), mean_ref.data(), rows, test::f32_kernel);
    DSA_CHECK_CLOSE(rstd.data(), rstd_ref.data(), rows, test::f32_kernel);
  }
}

TEST_CASE("layernorm: backward matches the double reference and accumulates dgamma, dbeta, on every path") {
  for (cpu::isa path : test::isa_paths())
  for (auto [rows, c] : awkward) {
    CAPTURE(cpu::isa_name(path));
    CAPTURE(rows);
    CAPTURE(c);
    const auto x = random_vector(rows * c, -2.0f, 4.0f, 4);
    const auto dy = random_vector(rows * c, -1.0f, 1.0f, 5);
    const auto gamma = random_gamma(c, 6), beta = random_vector(c, -0.5f, 0.5f, 7);
    std::vector<float> y(x.size()), mean(rows), rstd(rows);
    cpu::layernorm_forward_ref(y.data(), mean.data(), rstd.data(), x.data(), gamma.data(),
                               beta.data(), 1e-5f, rows, c);
    std::vector<float> dx(x.size()), dx_ref(x.size());
    auto dgamma = random_vector(c, -1.0f, 1.0f, 8), dbeta = random_vector(c, -1.0f, 1.0f, 9);
    auto dgamma_ref = dgamma, dbeta_ref = dbeta; // += onto the same prior values
    cpu::layernorm_backward(path, dx.data(), dgamma.data(), dbeta.data(), dy.data(), x.data(),
                            mean.data(), rstd.data(), gamma.data(), rows, c);
    cpu::layernorm_backward_ref(dx_ref.data(), dgamma_ref.data(), dbeta_ref.data(), dy.data(),
                                x.data(), mean.data(), rstd.data(), gamma.data(), rows, c);
    DSA_CHECK_CLOSE(dx.data(), dx_ref.data(), rows * c, test::f32_kernel);
    DSA_CHECK_CLOSE(dgamma.data(), dgamma_ref.data(), c, test::f32_kernel);
    DSA_CHECK_CLOSE(dbeta.data(), dbeta_ref.data(), c, test::f32_kernel);
  }
}

TEST_CASE("layernorm: backward equals central differences of the double forward") {
  const std::int64_t rows = 3, c = 13;
  const float eps = 1e-5f;
  const auto xf = random_vector(rows * c, -1.0f, 1.0f, 10);
  const auto dyf = random_vector(rows * c, -1.0f, 1.0f, 11);
  const auto gf = random_gamma(c, 12), bf = random_vector(c, -0.5f, 0.5f, 13);
  auto x = to_double(xf), dy = to_double(dyf), g = to_double(gf), b = to_double(bf);
  auto f = [&] { return objective(x, g, b, dy, eps, rows, c); };
  const auto fd_dx = test::central_difference(x, f, 1e-6);
  const auto fd_dgamma = test::central_difference(g, f, 1e-6);
  const auto fd_dbeta = test::central_difference(b, f, 1e-6);

  std::vector<float> y(xf.size()), mean(rows), rstd(rows);
  cpu::layernorm_forward_ref(y.data(), mean.data(), rstd.data(), xf.data(), gf.data(), bf.data(),
                             eps, rows, c);
  { // the double objective is the reference forward's
    double from_ref = 0.0;
    for (std::size_t i = 0; i < y.size(); ++i)
      from_ref += static_cast<double>(dyf[i]) * y[i];
    const double direct = f();
    DSA_CHECK_CLOSE(&from_ref, &direct, 1, test::f32_kernel);
  }
  std::vector<float> dx_ref(xf.size()), dg_ref(c, 0.0f), db_ref(c, 0.0f);
  cpu::layernorm_backward_ref(dx_ref.data(), dg_ref.data(), db_ref.data(), dyf.data(), xf.data(),
                              mean.data(), rstd.data(), gf.data(), rows, c);
  DSA_CHECK_CLOSE(dx_ref.data(), fd_dx.data(), rows * c, test::finite_diff);
  DSA_CHECK_CLOSE(dg_ref.data(), fd_dgamma.data(), c, test::finite_diff);
  DSA_CHECK_CLOSE(db_ref.data(), fd_dbeta.data(), c, test::finite_diff);

  std::vector<float> dx(xf.size()), dg(c, 0.0f), db(c, 0.0f);
  cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), xf.data(), gf.data(), bf.data(), eps,
                         rows, c);
  cpu::layernorm_backward(dx.data(), dg.data(), db.data(), dyf.data(), xf.data(), mean.data(),
                          rstd.data(), gf.data(), rows, c);
  DSA_CHECK_CLOSE(dx.data(), fd_dx.data(), rows * c, test::f32_kernel);
  DSA_CHECK_CLOSE(dg.data(), fd_dgamma.data(), c, test::f32_kernel);
  DSA_CHECK_CLOSE(db.data(), fd_dbeta.data(), c, test::f32_kernel);
}

TEST_CASE("layernorm: backward from the output equals backward from the input, on every path") {
  for (cpu::isa path : test::isa_paths())
  for (auto [rows, c] : awkward) {
    CAPTURE(cpu::isa_name(path));
    CAPTURE(rows);
    CAPTURE(c);
    const auto x = random_vector(rows * c, -2.0f, 4.0f, 14);
    const auto dy = random_vector(rows * c, -1.0f, 1.0f, 15);
    const auto gamma = random_gamma(c, 16), beta = random_vector(c, -0.5f, 0.5f, 17);
    std::vector<float> y(x.size()), mean(rows), rstd(rows);
    cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), gamma.data(), beta.data(),
                           1e-12f, rows, c);
    std::vector<float> dx_in(x.size()), dg_in(c, 0.0f), db_in(c, 0.0f);
    std::vector<float> dx_out(x.size()), dg_out(c, 0.0f), db_out(c, 0.0f);
    cpu::layernorm_backward(path, dx_in.data(), dg_in.data(), db_in.data(), dy.data(), x.data(),
                            mean.data(), rstd.data(), gamma.data(), rows, c);
    cpu::layernorm_backward_from_output(path, dx_out.data(), dg_out.data(), db_out.data(), dy.data(),
                                        y.data(), rstd.data(), gamma.data(), beta.data(), rows, c);
    DSA_CHECK_CLOSE(dx_out.data(), dx_in.data(), rows * c, test::layernorm_invertible);
    DSA_CHECK_CLOSE(dg_out.data(), dg_in.data(), c, test::layernorm_invertible);
    DSA_CHECK_CLOSE(db_out.data(), db_in.data(), c, test::layernorm_invertible);
  }
}

TEST_CASE("layernorm: in-place forward and backward give the out-of-place results") {
  const std::int64_t rows = 67, c = 100;
  const auto x = random_vector(rows * c, -2.0f, 4.0f, 18);
  const auto dy = random_vector(rows * c, -1.0f, 1.0f, 19);
  const auto gamma = random_gamma(c, 20), beta = random_vector(c, -0.5f, 0.5f, 21);
  std::vector<float> y(x.size()), mean(rows), rstd(rows);
  cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), gamma.data(), beta.data(),
                         1e-12f, rows, c);
  auto inplace = x;
  cpu::layernorm_forward(inplace.data(), nullptr, nullptr, inplace.data(), gamma.data(),
                         beta.data(), 1e-12f, rows, c);
  CHECK(inplace == y);

  std::vector<float> dx(x.size()), dg(c, 0.0f), db(c, 0.0f), dg2(c, 0.0f), db2(c, 0.0f);
  cpu::layernorm_backward(dx.data(), dg.data(), db.data(), dy.data(), x.data(), mean.data(),
                          rstd.data(), gamma.data(), rows, c);
  auto dinplace = dy;
  cpu::layernorm_backward(dinplace.data(), dg2.data(), db2.data(), dinplace.data(), x.data(),
                          mean.data(), rstd.data(), gamma.data(), rows, c);
  CHECK(dinplace == dx);
  CHECK(dg2 == dg);
  CHECK(db2 == db);
  dinplace = dy;
  std::vector<float> dx_out(x.size()), dg3(c, 0.0f), db3(c, 0.0f);
  cpu::layernorm_backward_from_output(dx_out.data(), dg3.data(), db3.data(), dy.data(), y.data(),
                                      rstd.data(), gamma.data(), beta.data(), rows, c);
  cpu::layernorm_backward_from_output(dinplace.data(), dg2.data(), db2.data(), dinplace.data(),
                                      y.data(), rstd.data(), gamma.data(), beta.data(), rows, c);
  CHECK(dinplace == dx_out);
}

TEST_CASE("layernorm: dgamma and dbeta are bit-identical whatever the thread count") {
  const std::int64_t rows = 515, c = 129; // large enough for the parallel path
  const auto x = random_vector(rows * c, -2.0f, 4.0f, 22);
  const auto dy = random_vector(rows * c, -1.0f, 1.0f, 23);
  const auto gamma = random_gamma(c, 24), beta = random_vector(c, -0.5f, 0.5f, 25);
  std::vector<float> y(x.size()), mean(rows), rstd(rows);
  cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), gamma.data(), beta.data(),
                         1e-12f, rows, c);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<float>> dgs, dbs;
  for (int threads : {1, 2, 3, 7}) {
    omp_set_num_threads(threads);
    std::vector<float> dx(x.size()), dg(c, 0.5f), db(c, -0.5f);
    cpu::layernorm_backward(dx.data(), dg.data(), db.data(), dy.data(), x.data(), mean.data(),
                            rstd.data(), gamma.data(), rows, c);
    dgs.push_back(dg);
    dbs.push_back(db);
  }
  omp_set_num_threads(saved);
  for (std::size_t k = 1; k < dgs.size(); ++k) {
    CHECK(std::memcmp(dgs[k].data(), dgs[0].data(), sizeof(float) * static_cast<std::size_t>(c)) ==
          0);
    CHECK(std::memcmp(dbs[k].data(), dbs[0].data(), sizeof(float) * static_cast<std::size_t>(c)) ==
          0);
  }
}

TEST_CASE("bias + dropout + residual + LayerNorm fused: the bits of the four kernels and the casts, every path") {
  const philox_stream stream{0xfeedull, 9, 2, 1, 3};
  for (auto [rows, c] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {5, 37}, {33, 256}, {300, 128}}) {
    const std::int64_t n = rows * c;
    const auto N = static_cast<std::size_t>(n);
    const auto product = random_vector(n, -3.0f, 3.0f, 81);
    const auto residual = random_vector(n, -1.0f, 1.0f, 82);
    const auto bias = random_vector(c, -0.5f, 0.5f, 83);
    const auto gamma = random_gamma(c, 84);
    const auto beta = random_vector(c, -0.5f, 0.5f, 85);
    const float eps = 1e-5f;
    for (float p : {0.0f, 0.1f, 0.5f}) {
      for (dtype half : {dtype::f16, dtype::bf16}) {
        for (cpu::isa path : test::isa_paths()) {
          INFO(cpu::isa_name(path) << " " << dtype_name(half) << " p " << p << " rows " << rows << " c " << c);
          // The separate kernels.
          std::vector<float> sum = product, y(N), mean(static_cast<std::size_t>(rows)), rstd(mean.size());
          std::vector<std::uint16_t> sum_half(N), y_half(N);
          cpu::bias_add(path, sum.data(), bias.data(), rows, c);
          cpu::dropout_residual_forward(path, sum.data(), sum.data(), residual.data(), p, stream, n);
          cpu::layernorm_forward(path, y.data(), mean.data(), rstd.data(), sum.data(), gamma.data(), beta.data(), eps,
                                 rows, c);
          cpu::cast(path, sum_half.data(), half, sum.data(), dtype::f32, n);
          cpu::cast(path, y_half.data(), half, y.data(), dtype::f32, n);

          // Fused with every output, the sum written over the product.
          std::vector<float> got_sum = product, got_y(N), got_mean(mean.size()), got_rstd(mean.size());
          std::vector<std::uint16_t> got_sum_half(N), got_y_half(N);
          cpu::residual_layernorm_args a;
          a.product = got_sum.data();
          a.bias = bias.data();
          a.residual = residual.data();
          a.p = p;
          a.stream = stream;
          a.gamma = gamma.data();
          a.beta = beta.data();
          a.eps = eps;
          a.sum = got_sum.data();
          a.sum_half = got_sum_half.data();
          a.y = got_y.data();
          a.y_half = got_y_half.data();
          a.mean = got_mean.data();
          a.rstd = got_rstd.data();
          a.half_type = half;
          cpu::residual_layernorm_forward(path, a, rows, c);
          CHECK(test::same_bits(got_sum, sum));
          CHECK(got_sum_half == sum_half);
          CHECK(test::same_bits(got_y, y));
          CHECK(got_y_half == y_half);
          CHECK(test::same_bits(got_mean, mean));
          CHECK(test::same_bits(got_rstd, rstd));

          // Only the half sum and y (the sum in the kernel's row buffer).
          std::vector<float> only_y(N);
          std::vector<std::uint16_t> only_sum_half(N);
          cpu::residual_layernorm_args b = a;
          b.product = product.data();
          b.sum = nullptr;
          b.sum_half = only_sum_half.data();
          b.y = only_y.data();
          b.y_half = nullptr;
          b.mean = nullptr;
          b.rstd = nullptr;
          cpu::residual_layernorm_forward(path, b, rows, c);
          CHECK(only_sum_half == sum_half);
          CHECK(test::same_bits(only_y, y));

          // Without the LayerNorm: the residual sum alone.
          std::vector<float> plain(N);
          cpu::residual_layernorm_args d = b;
          d.gamma = nullptr;
          d.beta = nullptr;
          d.y = nullptr;
          d.sum_half = nullptr;
          d.sum = plain.data();
          cpu::residual_layernorm_forward(path, d, rows, c);
          CHECK(test::same_bits(plain, sum));
        }
      }
    }
  }
}

TEST_CASE("layernorm_backward (args form): a half input widened per row and the dropout of dx, the bits of "
          "widening, layernorm_backward and dropout_forward, on every path") {
  const philox_stream stream{1234, 7};
  // The awkward sizes, and one past the parallel threshold (rows shared between threads).
  std::vector<sizes> shapes(std::begin(awkward), std::end(awkward));
  shapes.push_back({300, 257});
  for (cpu::isa path : test::isa_paths())
  for (auto [rows, c] : shapes)
  for (dtype x_type : {dtype::f32, dtype::f16, dtype::bf16})
  for (float p : {0.0f, 0.1f}) {
    CAPTURE(cpu::isa_name(path));
    CAPTURE(rows);
    CAPTURE(c);
    CAPTURE(dtype_name(x_type));
    CAPTURE(p);
    const auto x32 = random_vector(rows * c, -2.0f, 4.0f, 14);
    const auto dy = random_vector(rows * c, -1.0f, 1.0f, 15);
    const auto gamma = random_gamma(c, 16), beta = random_vector(c, -0.5f, 0.5f, 17);
    // The input as stored, and its exact widening (what the separate kernels read).
    std::vector<std::uint16_t> x16(x32.size());
    std::vector<float> x = x32;
    if (x_type != dtype::f32) {
      cpu::cast(x16.data(), x_type, x32.data(), dtype::f32, rows * c);
      cpu::cast(x.data(), dtype::f32, x16.data(), x_type, rows * c);
    }
    std::vector<float> y(x.size()), mean(rows), rstd(rows);
    cpu::layernorm_forward(path, y.data(), mean.data(), rstd.data(), x.data(), gamma.data(), beta.data(), 1e-5f, rows,
                           c);
    const auto dgamma0 = random_vector(c, -1.0f, 1.0f, 18), dbeta0 = random_vector(c, -1.0f, 1.0f, 19);
    std::vector<float> want_dx(x.size()), want_dropped(x.size());
    auto want_dgamma = dgamma0, want_dbeta = dbeta0;
    cpu::layernorm_backward(path, want_dx.data(), want_dgamma.data(), want_dbeta.data(), dy.data(), x.data(),
                            mean.data(), rstd.data(), gamma.data(), rows, c);
    cpu::dropout_forward(path, want_dropped.data(), nullptr, want_dx.data(), p, stream, rows * c);

    std::vector<float> dx(x.size()), dropped(x.size());
    auto dgamma = dgamma0, dbeta = dbeta0;
    cpu::layernorm_backward_args a;
    a.dx = dx.data();
    a.dgamma = dgamma.data();
    a.dbeta = dbeta.data();
    a.dy = dy.data();
    a.x = x_type == dtype::f32 ? static_cast<const void*>(x32.data()) : x16.data();
    a.x_type = x_type;
    a.mean = mean.data();
    a.rstd = rstd.data();
    a.gamma = gamma.data();
    a.dropped = dropped.data();
    a.p = p;
    a.stream = stream;
    cpu::layernorm_backward(path, a, rows, c);
    CHECK(test::same_bits(dx, want_dx));
    CHECK(test::same_bits(dropped, want_dropped));
    CHECK(test::same_bits(dgamma, want_dgamma));
    CHECK(test::same_bits(dbeta, want_dbeta));
    // Without a dropout output, and with dx over dy (in place).
    auto in_place = dy;
    auto dgamma2 = dgamma0, dbeta2 = dbeta0;
    a.dx = in_place.data();
    a.dy = in_place.data();
    a.dgamma = dgamma2.data();
    a.dbeta = dbeta2.data();
    a.dropped = nullptr;
    cpu::layernorm_backward(path, a, rows, c);
    CHECK(test::same_bits(in_place, want_dx));
  }
}
