// Every CUDA kernel against its CPU twin (the kernels/common math run serially on the
// host from the same rounded inputs) at awkward sizes, in f32, f16 and bf16.
#include "kernels/common/gelu_math.hpp"
#include "kernels/common/layernorm_math.hpp"
#include "kernels/common/residual_layernorm_math.hpp"
#include "kernels/cpu/adam.hpp"
#include "kernels/cpu/bias.hpp"
#include "kernels/cpu/dropout.hpp"
#include "kernels/cuda/activation.hpp"
#include "kernels/cuda/adam.hpp"
#include "kernels/cuda/bias.hpp"
#include "kernels/cuda/dropout.hpp"
#include "kernels/cuda/finite.hpp"
#include "kernels/cuda/heads.hpp"
#include "kernels/cuda/layernorm.hpp"
#include "kernels/cuda/ordered_sums.hpp"
#include "kernels/cuda/residual.hpp"
#include "kernels/cuda/residual_layernorm.hpp"

#include "tests/gpu/gpu_test_util.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/random.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

using namespace dsa;
using test::device_buffer;
using test::random_vector;

namespace {

constexpr cuda::elem all_types[] = {cuda::elem::f32, cuda::elem::f16, cuda::elem::bf16};
struct shape {
  std::int64_t rows, c;
};
// 1, primes, and sizes off the warp and block widths; and rows of BERT-large's 1024, where
// the kernels take their 8-wide vector and register paths.
constexpr shape awkward[] = {{1, 1}, {3, 7}, {17, 769}, {5, 1031}, {2, 4099}, {9, 1024}};

// Runs fn(type, shape) for every storage type and awkward shape, naming both on failure.
template <class Fn> void for_each_case(Fn fn) {
  for (auto type : all_types) {
    for (auto s : awkward) {
      INFO(std::string(test::elem_name(type)) << " rows=" << s.rows << " c=" << s.c);
      fn(type, s);
    }
  }
}

std::size_t bytes_of(std::int64_t n, cuda::elem type) {
  return static_cast<std::size_t>(n * cuda::elem_size(type));
}

} // namespace

TEST_CASE("cuda bias_gelu forward and backward match the CPU twin") {
  const test::test_stream stream;
  for_each_case([&](cuda::elem type, shape s) {
    const std::int64_t n = s.rows * s.c;
    const auto x = test::round_to(random_vector(n, -5.0f, 5.0f, 1), type);
    const auto dy = test::round_to(random_vector(n, -1.0f, 1.0f, 2), type);
    const auto bias = random_vector(s.c, -1.0f, 1.0f, 3);
    std::vector<float> y_twin(x.size()), dx_twin(x.size());
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      const float b = bias[static_cast<std::size_t>(i % s.c)];
      y_twin[k] = common::bias_gelu_forward_element(x[k], b);
      dx_twin[k] = common::bias_gelu_backward_element(dy[k], x[k], b);
    }
    y_twin = test::round_to(y_twin, type);
    dx_twin = test::round_to(dx_twin, type);

    device_buffer d_x(bytes_of(n, type)), d_dy(bytes_of(n, type)), d_y(bytes_of(n, type));
    device_buffer d_bias(bias.size() * 4);
    test::upload(d_x, test::encode(x, type));
    test::upload(d_dy, test::encode(dy, type));
    test::upload(d_bias, bias);
    DSA_REQUIRE_CUDA(cuda::bias_gelu_forward(d_y.as<void>(), d_x.as<void>(), d_bias.as<float>(),
                                             type, s.rows, s.c, stream.get()));
    // dx written over dy: the aliasing the header allows.
    DSA_REQUIRE_CUDA(cuda::bias_gelu_backward(d_dy.as<void>(), d_dy.as<void>(), d_x.as<void>(),
                                              d_bias.as<float>(), type, s.rows, s.c, stream.get()));
    stream.sync();
    const auto y = test::download(d_y, x.size(), type);
    const auto dx = test::download(d_dy, x.size(), type);
    const auto tol = test::storage_tolerance(type, test::gpu_f32_elementwise);
    DSA_CHECK_CLOSE(y.data(), y_twin.data(), n, tol);
    DSA_CHECK_CLOSE(dx.data(), dx_twin.data(), n, tol);
  });
}

TEST_CASE("cuda layernorm forward and backward match the CPU twin") {
  const test::test_stream stream;
  const float eps = 1e-12f;
  for_each_case([&](cuda::elem type, shape s) {
    if (s.c == 1)
      return; // rstd = 1/sqrt(eps): checked by the cpu suite, not informative here
    const std::int64_t n = s.rows * s.c;
    const auto nn = static_cast<std::size_t>(n), rows = static_cast<std::size_t>(s.rows);
    const auto x = test::round_to(random_vector(n, -2.0f, 3.0f, 11), type);
    const auto dy = test::round_to(random_vector(n, -1.0f, 1.0f, 12), type);
    const auto gamma = random_vector(s.c, 0.5f, 1.5f, 13);
    const auto beta = random_vector(s.c, -0.5f, 0.5f, 14);
    std::vector<float> y_twin(nn), mean_twin(rows), rstd_twin(rows), dx_twin(nn);
    std::vector<float> dg_twin(gamma.size(), 0.0f), db_twin(gamma.size(), 0.0f);
    for (std::int64_t r = 0; r < s.rows; ++r) {
      const auto k = static_cast<std::size_t>(r);
      common::layernorm_row_forward(y_twin.data() + r * s.c, &mean_twin[k], &rstd_twin[k],
                                    x.data() + r * s.c, gamma.data(), beta.data(), eps, s.c);
      common::layernorm_row_backward(dx_twin.data() + r * s.c, dg_twin.data(), db_twin.data(),
                                     dy.data() + r * s.c, x.data() + r * s.c, mean_twin[k],
                                     rstd_twin[k], gamma.data(), s.c);
    }
    y_twin = test::round_to(y_twin, type);
    dx_twin = test::round_to(dx_twin, type);

    device_buffer d_x(bytes_of(n, type)), d_y(bytes_of(n, type)), d_dy(bytes_of(n, type));
    device_buffer d_gamma(gamma.size() * 4), d_beta(beta.size() * 4), d_mean(rows * 4),
        d_rstd(rows * 4);
    device_buffer d_dg(gamma.size() * 4), d_db(gamma.size() * 4);
    test::upload(d_x, test::encode(x, type));
    test::upload(d_dy, test::encode(dy, type));
    test::upload(d_gamma, gamma);
    test::upload(d_beta, beta);
    DSA_REQUIRE_CUDA(cudaMemset(d_dg.as<void>(), 0, d_dg.bytes()));
    DSA_REQUIRE_CUDA(cudaMemset(d_db.as<void>(), 0, d_db.bytes()));
    DSA_REQUIRE_CUDA(cuda::layernorm_forward(
        d_y.as<void>(), d_mean.as<float>(), d_rstd.as<float>(), d_x.as<void>(), d_gamma.as<float>(),
        d_beta.as<float>(), eps, type, s.rows, s.c, stream.get()));
    // Backward from the twin's statistics, so its error is the backward's alone.
    device_buffer d_mean_twin(rows * 4), d_rstd_twin(rows * 4);
    test::upload(d_mean_twin, mean_twin);
    test::upload(d_rstd_twin, rstd_twin);
    DSA_REQUIRE_CUDA(cuda::layernorm_backward(
        d_dy.as<void>(), d_dg.as<float>(), d_db.as<float>(), d_dy.as<void>(), d_x.as<void>(),
        d_mean_twin.as<float>(), d_rstd_twin.as<float>(), d_gamma.as<float>(), type, s.rows, s.c,
        stream.get()));
    stream.sync();
    const auto y = test::download(d_y, nn, type);
    const auto mean = test::download(d_mean, rows, cuda::elem::f32);
    const auto rstd = test::download(d_rstd, rows, cuda::elem::f32);
    const auto dx = test::download(d_dy, nn, type);
    const auto dg = test::download(d_dg, gamma.size(), cuda::elem::f32);
    const auto db = test::download(d_db, gamma.size(), cuda::elem::f32);
    DSA_CHECK_CLOSE(mean.data(), mean_twin.data(), s.rows, test::gpu_f32_reduction);
    DSA_CHECK_CLOSE(rstd.data(), rstd_twin.data(), s.rows, test::gpu_f32_reduction);
    const auto tol = test::storage_tolerance(type, test::gpu_f32_reduction);
    DSA_CHECK_CLOSE(y.data(), y_twin.data(), n, tol);
    DSA_CHECK_CLOSE(dx.data(), dx_twin.data(), n, tol);
    DSA_CHECK_CLOSE(dg.data(), dg_twin.data(), s.c, test::gpu_f32_reduction);
    DSA_CHECK_CLOSE(db.data(), db_twin.data(), s.c, test::gpu_f32_reduction);
  });
}

TEST_CASE("cuda layernorm_param_backward (deterministic mode) matches the CPU twin, the same bits every run") {
  const test::test_stream stream;
  // Tall shapes too, so the rows go in several chunks; 8 columns per thread at 64 and at
  // BERT-large's 8192 x 1024, one per thread at the odd widths.
  for (const shape s : {shape{3, 7}, shape{17, 769}, shape{300, 33}, shape{5000, 64}, shape{8192, 1024}}) {
    for (auto type : all_types) {
      INFO(std::string(test::elem_name(type)) << " rows=" << s.rows << " c=" << s.c);
      const std::int64_t n = s.rows * s.c;
      const auto rows = static_cast<std::size_t>(s.rows);
      const auto x = test::round_to(random_vector(n, -2.0f, 3.0f, 21), type);
      const auto dy = test::round_to(random_vector(n, -1.0f, 1.0f, 22), type);
      const auto mean = random_vector(s.rows, -0.5f, 0.5f, 23), rstd = random_vector(s.rows, 0.5f, 2.0f, 24);
      std::vector<double> dg_twin(static_cast<std::size_t>(s.c), 0.0), db_twin(dg_twin.size(), 0.0);
      for (std::int64_t r = 0; r < s.rows; ++r)
        for (std::int64_t j = 0; j < s.c; ++j) {
          const auto i = static_cast<std::size_t>(r * s.c + j);
          const float xhat = (x[i] - mean[static_cast<std::size_t>(r)]) * rstd[static_cast<std::size_t>(r)];
          dg_twin[static_cast<std::size_t>(j)] += static_cast<double>(dy[i]) * xhat;
          db_twin[static_cast<std::size_t>(j)] += dy[i];
        }
      device_buffer d_x(bytes_of(n, type)), d_dy(bytes_of(n, type)), d_mean(rows * 4), d_rstd(rows * 4);
      device_buffer d_dg(static_cast<std::size_t>(s.c) * 4), d_db(static_cast<std::size_t>(s.c) * 4);
      test::upload(d_x, test::encode(x, type));
      test::upload(d_dy, test::encode(dy, type));
      test::upload(d_mean, mean);
      test::upload(d_rstd, rstd);
      std::vector<float> first_g, first_b;
      for (int run = 0; run < 2; ++run) {
        DSA_REQUIRE_CUDA(cudaMemset(d_dg.as<void>(), 0, d_dg.bytes()));
        DSA_REQUIRE_CUDA(cudaMemset(d_db.as<void>(), 0, d_db.bytes()));
        DSA_REQUIRE_CUDA(cuda::layernorm_param_backward(d_dg.as<float>(), d_db.as<float>(), d_dy.as<void>(),
                                                        d_x.as<void>(), d_mean.as<float>(), d_rstd.as<float>(), type,
                                                        s.rows, s.c, stream.get()));
        stream.sync();
        const auto dg = test::download(d_dg, static_cast<std::size_t>(s.c), cuda::elem::f32);
        const auto db = test::download(d_db, static_cast<std::size_t>(s.c), cuda::elem::f32);
        if (run == 0) {
          const std::vector<float> g32(dg_twin.begin(), dg_twin.end()), b32(db_twin.begin(), db_twin.end());
          DSA_CHECK_CLOSE(dg.data(), g32.data(), s.c, test::gpu_f32_column_sums);
          DSA_CHECK_CLOSE(db.data(), b32.data(), s.c, test::gpu_f32_column_sums);
          first_g = dg;
          first_b = db;
        } else {
          CHECK(std::memcmp(dg.data(), first_g.data(), dg.size() * 4) == 0);
          CHECK(std::memcmp(db.data(), first_b.data(), db.size() * 4) == 0);
        }
      }
    }
  }
}

TEST_CASE("cuda layernorm_param_backward: a misaligned dy gives the aligned bits; one output alone") {
  // 8 columns per thread wants dy and x aligned; one element off takes the one-column lanes,
  // which add in the same order. And either output may be left out.
  const test::test_stream stream;
  for (const cuda::elem type : all_types) {
    INFO(test::elem_name(type));
    const std::int64_t rows = 5000, c = 64, n = rows * c;
    const auto x = test::round_to(random_vector(n + 1, -2.0f, 3.0f, 31), type);
    const auto dy = test::round_to(random_vector(n + 1, -1.0f, 1.0f, 32), type);
    const auto mean = random_vector(rows, -0.5f, 0.5f, 33), rstd = random_vector(rows, 0.5f, 2.0f, 34);
    device_buffer d_x(bytes_of(n + 1, type)), d_dy(bytes_of(n + 1, type));
    device_buffer d_mean(static_cast<std::size_t>(rows) * 4), d_rstd(static_cast<std::size_t>(rows) * 4);
    device_buffer d_x0(bytes_of(n, type)), d_dy0(bytes_of(n, type));
    test::upload(d_x, test::encode(x, type));
    test::upload(d_dy, test::encode(dy, type));
    test::upload(d_mean, mean);
    test::upload(d_rstd, rstd);
    const std::size_t one = bytes_of(1, type);
    const void* x1 = static_cast<const char*>(d_x.as<void>()) + one;
    const void* dy1 = static_cast<const char*>(d_dy.as<void>()) + one;
    DSA_REQUIRE_CUDA(cudaMemcpy(d_x0.as<void>(), x1, bytes_of(n, type), cudaMemcpyDeviceToDevice));
    DSA_REQUIRE_CUDA(cudaMemcpy(d_dy0.as<void>(), dy1, bytes_of(n, type), cudaMemcpyDeviceToDevice));
    const auto cols = static_cast<std::size_t>(c);
    auto sums = [&](const void* dyp, const void* xp, bool gamma, bool beta) {
      device_buffer g(cols * 4), b(cols * 4);
      DSA_REQUIRE_CUDA(cudaMemset(g.as<void>(), 0, g.bytes()));
      DSA_REQUIRE_CUDA(cudaMemset(b.as<void>(), 0, b.bytes()));
      DSA_REQUIRE_CUDA(cuda::layernorm_param_backward(gamma ? g.as<float>() : nullptr, beta ? b.as<float>() : nullptr,
                                                      dyp, xp, d_mean.as<float>(), d_rstd.as<float>(), type, rows, c,
                                                      stream.get()));
      stream.sync();
      return std::pair{test::download(g, cols, cuda::elem::f32), test::download(b, cols, cuda::elem::f32)};
    };
    const auto aligned = sums(d_dy0.as<void>(), d_x0.as<void>(), true, true);
    const auto shifted = sums(dy1, x1, true, true);
    CHECK(shifted.first == aligned.first);
    CHECK(shifted.second == aligned.second);
    const auto gamma_only = sums(d_dy0.as<void>(), d_x0.as<void>(), true, false);
    CHECK(gamma_only.first == aligned.first);
    CHECK(gamma_only.second == std::vector<float>(cols, 0.0f)); // untouched
    const auto beta_only = sums(d_dy0.as<void>(), d_x0.as<void>(), false, true);
    CHECK(beta_only.second == aligned.second);
    CHECK(beta_only.first == std::vector<float>(cols, 0.0f));
  }
}

TEST_CASE("cuda ordered_row_scatter_add adds each key's rows in the given order, bit for bit") {
  const test::test_stream stream;
  const std::int64_t rows = 37, c = 45, table_rows = 11;
  for (auto type : all_types) {
    INFO(test::elem_name(type));
    const auto src = test::round_to(random_vector(rows * c, -2.0f, 2.0f, 31), type);
    const auto start = random_vector(table_rows * c, -1.0f, 1.0f, 32);
    // Keys 9, 2, 5 (distinct, any order) over rows in a scrambled order; row 36 unused.
    const std::vector<std::int32_t> key{9, 2, 5}, offsets{0, 12, 13, 36};
    std::vector<std::int32_t> order;
    for (std::int32_t i = 0; i < 36; ++i)
      order.push_back((i * 7) % 36);
    std::vector<float> twin = start;
    for (std::size_t k = 0; k < key.size(); ++k)
      for (std::int64_t j = 0; j < c; ++j) {
        float sum = 0.0f;
        for (std::int32_t i = offsets[k]; i < offsets[k + 1]; ++i)
          sum += src[static_cast<std::size_t>(order[static_cast<std::size_t>(i)] * c + j)];
        twin[static_cast<std::size_t>(key[k] * c + j)] += sum;
      }
    device_buffer d_table(start.size() * 4), d_src(bytes_of(rows * c, type)), d_key(key.size() * 4),
        d_offsets(offsets.size() * 4), d_order(order.size() * 4);
    test::upload(d_table, start);
    test::upload(d_src, test::encode(src, type));
    DSA_REQUIRE_CUDA(cudaMemcpy(d_key.as<void>(), key.data(), key.size() * 4, cudaMemcpyHostToDevice));
    DSA_REQUIRE_CUDA(cudaMemcpy(d_offsets.as<void>(), offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));
    DSA_REQUIRE_CUDA(cudaMemcpy(d_order.as<void>(), order.data(), order.size() * 4, cudaMemcpyHostToDevice));
    DSA_REQUIRE_CUDA(cuda::ordered_row_scatter_add(d_table.as<float>(), d_src.as<void>(), d_key.as<std::int32_t>(),
                                                   d_offsets.as<std::int32_t>(), d_order.as<std::int32_t>(), type, 3,
                                                   c, stream.get()));
    stream.sync();
    const auto got = test::download(d_table, start.size(), cuda::elem::f32);
    CHECK(std::memcmp(got.data(), twin.data(), twin.size() * 4) == 0);
  }
}

TEST_CASE("cuda adam equals the CPU kernel bit for bit, with the half copy") {
  const test::test_stream stream;
  // IEEE division and sqrt (nvcc's defaults) and explicit fma: the same f32 operations.
  for (auto half : {cuda::elem::f16, cuda::elem::bf16}) {
    for (std::int64_t n : {1, 13, 100003}) {
      CAPTURE(test::elem_name(half));
      CAPTURE(n);
      const auto nn = static_cast<std::size_t>(n);
      cpu::adam_params params;
      params.lr = 1e-3f;
      params.weight_decay = 0.01f;
      auto p = random_vector(n, -1.0f, 1.0f, 21);
      std::vector<float> m(nn, 0.0f), v(nn, 0.0f);
      std::vector<std::uint16_t> h(nn);
      device_buffer d_p(nn * 4), d_m(nn * 4), d_v(nn * 4), d_g(nn * 4), d_h(nn * 2);
      test::upload(d_p, p);
      test::upload(d_m, m);
      test::upload(d_v, v);
      for (std::int64_t step = 1; step <= 3; ++step) {
        params.step = step;
        const auto g = random_vector(n, -0.05f, 0.05f, static_cast<std::uint32_t>(30 + step));
        test::upload(d_g, g);
        cpu::adam_update(p.data(), m.data(), v.data(), g.data(), h.data(),
                         half == cuda::elem::f16 ? dtype::f16 : dtype::bf16, params, n);
        DSA_REQUIRE_CUDA(cuda::adam_update(d_p.as<float>(), d_m.as<float>(), d_v.as<float>(),
                                           d_g.as<float>(), d_h.as<std::uint16_t>(), half,
                                           cpu::make_adam_consts(params), n, stream.get()));
        stream.sync(); // d_g is overwritten next step
      }
      const auto gp = test::download_bytes(d_p, nn * 4), gm = test::download_bytes(d_m, nn * 4);
      const auto gv = test::download_bytes(d_v, nn * 4), gh = test::download_bytes(d_h, nn * 2);
      CHECK(std::memcmp(gp.data(), p.data(), nn * 4) == 0);
      CHECK(std::memcmp(gm.data(), m.data(), nn * 4) == 0);
      CHECK(std::memcmp(gv.data(), v.data(), nn * 4) == 0);
      CHECK(std::memcmp(gh.data(), h.data(), nn * 2) == 0);
      // On a mismatch, say where and by how much.
      const auto gpf = test::download(d_p, nn, cuda::elem::f32);
      DSA_CHECK_CLOSE(gpf.data(), p.data(), n, test::optimizer_step);
    }
  }
}

TEST_CASE("cuda unscale_and_check finds inf and NaN and unscales exactly") {
  const test::test_stream stream;
  for (auto type : all_types) {
    for (std::int64_t n : {1, 37, 70001}) {
      CAPTURE(test::elem_name(type));
      CAPTURE(n);
      const auto nn = static_cast<std::size_t>(n);
      const auto g = test::round_to(random_vector(n, -4.0f, 4.0f, 41), type);
      device_buffer d_g(bytes_of(n, type)), d_flag(sizeof(int));
      int flag = 0;
      // Clean buffer, scale 1/1024 (a power of two: exact in every type away from subnormals).
      test::upload(d_g, test::encode(g, type));
      DSA_REQUIRE_CUDA(cudaMemset(d_flag.as<void>(), 0, sizeof(int)));
      DSA_REQUIRE_CUDA(cuda::unscale_and_check(d_g.as<void>(), d_flag.as<int>(), 1.0f / 1024.0f,
                                               type, n, stream.get()));
      stream.sync();
      DSA_REQUIRE_CUDA(cudaMemcpy(&flag, d_flag.as<void>(), sizeof(int), cudaMemcpyDeviceToHost));
      CHECK(flag == 0);
      const auto out = test::download(d_g, nn, type);
      std::vector<float> expect(nn);
      for (std::size_t i = 0; i < nn; ++i)
        expect[i] = g[i] / 1024.0f;
      expect = test::round_to(expect, type);
      CHECK(std::memcmp(out.data(), expect.data(), nn * 4) == 0);
      // One inf, then one NaN, at the last element (the tail of the last warp).
      for (float bad :
           {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
        auto poisoned = g;
        poisoned.back() = bad;
        test::upload(d_g, test::encode(poisoned, type));
        DSA_REQUIRE_CUDA(cudaMemset(d_flag.as<void>(), 0, sizeof(int)));
        DSA_REQUIRE_CUDA(
            cuda::unscale_and_check(d_g.as<void>(), d_flag.as<int>(), 1.0f, type, n, stream.get()));
        stream.sync();
        DSA_REQUIRE_CUDA(cudaMemcpy(&flag, d_flag.as<void>(), sizeof(int), cudaMemcpyDeviceToHost));
        CHECK(flag == 1);
      }
    }
  }
}

TEST_CASE("cuda bias_add equals the CPU's f32 sum rounded once, in place for f32") {
  const test::test_stream stream;
  for_each_case([&](cuda::elem type, shape s) {
    const auto x = random_vector(s.rows * s.c, -2.0f, 2.0f, 53);
    const auto bias = random_vector(s.c, -1.0f, 1.0f, 54);
    std::vector<float> twin = x;
    cpu::bias_add(twin.data(), bias.data(), s.rows, s.c);
    const auto expected = test::encode(twin, type); // one rounding of the f32 sum
    device_buffer d_x(x.size() * 4), d_y(bytes_of(s.rows * s.c, type)), d_b(bias.size() * 4);
    test::upload(d_x, x);
    test::upload(d_b, bias);
    DSA_REQUIRE_CUDA(cudaMemset(d_y.as<void>(), 0xff, d_y.bytes()));
    DSA_REQUIRE_CUDA(cuda::bias_add(d_y.as<void>(), d_x.as<float>(), d_b.as<float>(), type, s.rows,
                                    s.c, stream.get()));
    stream.sync();
    CHECK(test::download_bytes(d_y, expected.size()) == expected);
    if (type == cuda::elem::f32) {
      DSA_REQUIRE_CUDA(cuda::bias_add(d_x.as<void>(), d_x.as<float>(), d_b.as<float>(), type,
                                      s.rows, s.c, stream.get()));
      stream.sync();
      CHECK(test::download_bytes(d_x, expected.size()) == expected);
    } else { // a half y over its own f32 input would overwrite what later elements read
      CHECK(cuda::bias_add(d_x.as<void>(), d_x.as<float>(), d_b.as<float>(), type, s.rows, s.c,
                           stream.get()) == cudaErrorInvalidValue);
    }
  });
  CHECK(cuda::bias_add(nullptr, nullptr, nullptr, cuda::elem::f32, 1, 1, stream.get()) ==
        cudaErrorInvalidValue);
}

TEST_CASE("cuda split_heads and merge_heads permute exactly, the bias added once in f32") {
  const test::test_stream stream;
  const std::int64_t batch = 3, seq = 7, heads = 5;
  // d = 9: element by element; d = 16: 8 elements per access.
  for (const std::int64_t d : {std::int64_t{9}, std::int64_t{16}})
  for (const cuda::elem type : all_types) {
    INFO(std::string(test::elem_name(type)) << " d=" << d);
    const std::int64_t n = batch * seq * heads * d;
    const auto rows = random_vector(n, -2.0f, 2.0f, 57);
    const auto bias = random_vector(heads * d, -1.0f, 1.0f, 58);
    // From an f32 product with the bias (the projections' path), and type to type without.
    std::vector<float> with_bias(static_cast<std::size_t>(n)), plain(static_cast<std::size_t>(n));
    const auto stored = test::round_to(rows, type);
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t t = 0; t < seq; ++t)
          for (std::int64_t j = 0; j < d; ++j) {
            const auto dst = static_cast<std::size_t>(((b * heads + h) * seq + t) * d + j);
            const auto src = static_cast<std::size_t>((b * seq + t) * heads * d + h * d + j);
            with_bias[dst] = rows[src] + bias[static_cast<std::size_t>(h * d + j)];
            plain[dst] = stored[src];
          }
    device_buffer d_rows(static_cast<std::size_t>(n) * 4), d_stored(bytes_of(n, type)),
        d_heads(bytes_of(n, type)), d_back(bytes_of(n, type)), d_bias(bias.size() * 4);
    test::upload(d_rows, rows);
    test::upload(d_stored, test::encode(stored, type));
    test::upload(d_bias, bias);
    DSA_REQUIRE_CUDA(cuda::split_heads(d_heads.as<void>(), type, d_rows.as<void>(), cuda::elem::f32,
                                       d_bias.as<float>(), batch, seq, heads, d, stream.get()));
    stream.sync();
    CHECK(test::download_bytes(d_heads, d_heads.bytes()) == test::encode(with_bias, type));
    DSA_REQUIRE_CUDA(cuda::split_heads(d_heads.as<void>(), type, d_stored.as<void>(), type, nullptr,
                                       batch, seq, heads, d, stream.get()));
    DSA_REQUIRE_CUDA(cudaMemset(d_back.as<void>(), 0xff, d_back.bytes()));
    DSA_REQUIRE_CUDA(cuda::merge_heads(d_back.as<void>(), d_heads.as<void>(), type, batch, seq, heads,
                                       d, stream.get()));
    stream.sync();
    CHECK(test::download_bytes(d_heads, d_heads.bytes()) == test::encode(plain, type));
    CHECK(test::download_bytes(d_back, d_back.bytes()) == test::encode(stored, type));
    // Overlapping buffers and bad sizes are refused.
    CHECK(cuda::merge_heads(d_heads.as<void>(), d_heads.as<void>(), type, batch, seq, heads, d,
                            stream.get()) == cudaErrorInvalidValue);
    CHECK(cuda::split_heads(d_heads.as<void>(), type, d_stored.as<void>(), type, nullptr, batch, 0,
                            heads, d, stream.get()) == cudaErrorInvalidValue);
  }
}

TEST_CASE("cuda bias_backward matches the CPU kernel") {
  const test::test_stream stream;
  for_each_case([&](cuda::elem type, shape s) {
    const auto dy = test::round_to(random_vector(s.rows * s.c, -1.0f, 1.0f, 51), type);
    auto dbias_twin = random_vector(s.c, -1.0f, 1.0f, 52); // += onto existing values
    device_buffer d_dy(bytes_of(s.rows * s.c, type)), d_db(dbias_twin.size() * 4);
    test::upload(d_dy, test::encode(dy, type));
    test::upload(d_db, dbias_twin);
    cpu::bias_backward_ref(dbias_twin.data(), dy.data(), s.rows, s.c);
    DSA_REQUIRE_CUDA(
        cuda::bias_backward(d_db.as<float>(), d_dy.as<void>(), type, s.rows, s.c, stream.get()));
    stream.sync();
    const auto db = test::download(d_db, dbias_twin.size(), cuda::elem::f32);
    DSA_CHECK_CLOSE(db.data(), dbias_twin.data(), s.c, test::gpu_f32_reduction);
  });
  // Inputs of more than 64 rows take the two-pass path (chunks of rows, then their sums in
  // order): 3001 rows (a last chunk shorter than the rest), 8 columns per thread at 1024 and
  // at a BERT-large micro-batch's 8192 x 1024, a decoder bias's 30522 columns (one per
  // thread, two chunks), 65 rows (two chunks of 33 and 32), and 70000 rows of 5 columns (the
  // most chunks, 1094, each of 64 rows).
  for (const cuda::elem type : all_types)
    for (const shape s : {shape{3001, 37}, shape{3001, 1030}, shape{3001, 1024}, shape{8192, 1024},
                          shape{1280, 30522}, shape{65, 24}, shape{70000, 5}}) {
      INFO(std::string(test::elem_name(type)) << " rows=" << s.rows << " c=" << s.c);
      const auto dy = test::round_to(random_vector(s.rows * s.c, -1.0f, 1.0f, 55), type);
      auto dbias_twin = random_vector(s.c, -1.0f, 1.0f, 56);
      device_buffer d_dy(bytes_of(s.rows * s.c, type)), d_db(dbias_twin.size() * 4);
      test::upload(d_dy, test::encode(dy, type));
      test::upload(d_db, dbias_twin);
      cpu::bias_backward_ref(dbias_twin.data(), dy.data(), s.rows, s.c);
      DSA_REQUIRE_CUDA(cuda::bias_backward(d_db.as<float>(), d_dy.as<void>(), type, s.rows, s.c,
                                           stream.get()));
      stream.sync();
      const auto db = test::download(d_db, dbias_twin.size(), cuda::elem::f32);
      const auto again = db; // a second run from the same start gives the same bits
      test::upload(d_db, random_vector(s.c, -1.0f, 1.0f, 56));
      DSA_REQUIRE_CUDA(cuda::bias_backward(d_db.as<float>(), d_dy.as<void>(), type, s.rows, s.c,
                                           stream.get()));
      stream.sync();
      CHECK(test::download(d_db, dbias_twin.size(), cuda::elem::f32) == again);
      // f32 sums of thousands of rows: the tolerance grows with the count (sqrt(rows) ulps).
      DSA_CHECK_CLOSE(db.data(), dbias_twin.data(), s.c, test::gpu_f32_column_sums);
    }
  // A misaligned dy with a width of a multiple of 8 takes the one-column lanes: the same
  // order, so the aligned call's bits.
  for (const cuda::elem type : all_types) {
    INFO(test::elem_name(type));
    const std::int64_t rows = 700, c = 64;
    const auto dy = test::round_to(random_vector(rows * c + 1, -1.0f, 1.0f, 57), type);
    device_buffer d_dy(bytes_of(rows * c + 1, type)), d_a(static_cast<std::size_t>(c) * 4), d_b(static_cast<std::size_t>(c) * 4);
    test::upload(d_dy, test::encode(dy, type));
    test::upload(d_a, std::vector<float>(static_cast<std::size_t>(c), 0.0f));
    test::upload(d_b, std::vector<float>(static_cast<std::size_t>(c), 0.0f));
    const std::size_t one = bytes_of(1, type);
    DSA_REQUIRE_CUDA(cuda::bias_backward(d_a.as<float>(), static_cast<const char*>(d_dy.as<void>()) + one, type, rows,
                                         c, stream.get()));
    // The same values aligned: copied down one element.
    device_buffer d_aligned(bytes_of(rows * c, type));
    DSA_REQUIRE_CUDA(cudaMemcpy(d_aligned.as<void>(), static_cast<const char*>(d_dy.as<void>()) + one,
                                bytes_of(rows * c, type), cudaMemcpyDeviceToDevice));
    DSA_REQUIRE_CUDA(cuda::bias_backward(d_b.as<float>(), d_aligned.as<void>(), type, rows, c, stream.get()));
    stream.sync();
    CHECK(test::download(d_a, static_cast<std::size_t>(c), cuda::elem::f32) ==
          test::download(d_b, static_cast<std::size_t>(c), cuda::elem::f32));
  }
}

TEST_CASE("cuda dropout forward and backward draw the CPU's mask from the same Philox counters") {
  const test::test_stream stream;
  philox_stream rng;
  rng.seed = 0xfeedfacecafebeefull;
  rng.step = 7;
  rng.micro_batch = 1;
  rng.layer = 11;
  rng.site = 3;
  for (auto type : all_types) {
    for (std::int64_t n : {1, 7, 4099, 1000003}) {
      CAPTURE(test::elem_name(type));
      CAPTURE(n);
      const auto nn = static_cast<std::size_t>(n);
      const float p = 0.1f;
      const auto x = test::round_to(random_vector(n, -3.0f, 3.0f, 61), type);
      std::vector<float> y_twin(nn);
      std::vector<std::uint8_t> mask_twin(nn);
      cpu::dropout_forward(y_twin.data(), mask_twin.data(), x.data(), p, rng, n);
      y_twin = test::round_to(y_twin, type);
      device_buffer d_x(bytes_of(n, type)), d_mask(nn);
      test::upload(d_x, test::encode(x, type));
      // In place (y aliases x), as the header allows.
      DSA_REQUIRE_CUDA(cuda::dropout_forward(d_x.as<void>(), d_mask.as<std::uint8_t>(),
                                             d_x.as<void>(), p, rng, type, n, stream.get()));
      stream.sync();
      const auto mask = test::download_bytes(d_mask, nn);
      const auto y = test::download(d_x, nn, type);
      CHECK(mask == mask_twin);
      CHECK(std::memcmp(y.data(), y_twin.data(), nn * 4) == 0);
      // Backward with the mask recomputed: dy = x here, against cpu::dropout_backward.
      std::vector<float> dx_twin(nn);
      cpu::dropout_backward(dx_twin.data(), x.data(), mask_twin.data(), p, n);
      dx_twin = test::round_to(dx_twin, type);
      test::upload(d_x, test::encode(x, type));
      DSA_REQUIRE_CUDA(
          cuda::dropout_backward(d_x.as<void>(), d_x.as<void>(), p, rng, type, n, stream.get()));
      stream.sync();
      const auto dx = test::download(d_x, nn, type);
      CHECK(std::memcmp(dx.data(), dx_twin.data(), nn * 4) == 0);
    }
  }
}

TEST_CASE("cuda residual layernorm forward matches the CPU twin, mask included") {
  const test::test_stream stream;
  philox_stream rng;
  rng.seed = 2024;
  rng.step = 2;
  rng.layer = 7;
  for_each_case([&](cuda::elem type, shape s) {
    if (s.c == 1)
      return;
    const std::int64_t n = s.rows * s.c;
    const auto nn = static_cast<std::size_t>(n), rows = static_cast<std::size_t>(s.rows);
    const float p = 0.1f, eps = 1e-12f;
    const auto x = test::round_to(random_vector(n, -2.0f, 2.0f, 91), type);
    const auto residual = test::round_to(random_vector(n, -1.0f, 1.0f, 92), type);
    const auto bias = random_vector(s.c, -0.5f, 0.5f, 93),
               gamma = random_vector(s.c, 0.5f, 1.5f, 94);
    const auto beta = random_vector(s.c, -0.5f, 0.5f, 95);
    std::vector<float> y_twin(nn), v_twin(nn), mean_twin(rows), rstd_twin(rows);
    for (std::int64_t r = 0; r < s.rows; ++r)
      common::residual_layernorm_row_forward(
          y_twin.data() + r * s.c, v_twin.data() + r * s.c, &mean_twin[static_cast<std::size_t>(r)],
          &rstd_twin[static_cast<std::size_t>(r)], x.data() + r * s.c, bias.data(),
          residual.data() + r * s.c, gamma.data(), beta.data(), p, rng,
          static_cast<std::uint64_t>(r * s.c), eps, s.c);
    y_twin = test::round_to(y_twin, type);
    v_twin = test::round_to(v_twin, type);
    device_buffer d_x(bytes_of(n, type)), d_res(bytes_of(n, type)), d_v(bytes_of(n, type));
    device_buffer d_bias(bias.size() * 4), d_gamma(gamma.size() * 4), d_beta(beta.size() * 4);
    device_buffer d_mean(rows * 4), d_rstd(rows * 4);
    test::upload(d_x, test::encode(x, type));
    test::upload(d_res, test::encode(residual, type));
    test::upload(d_bias, bias);
    test::upload(d_gamma, gamma);
    test::upload(d_beta, beta);
    // y written over the residual, as the header allows.
    DSA_REQUIRE_CUDA(cuda::residual_layernorm_forward(
        d_res.as<void>(), d_v.as<void>(), d_mean.as<float>(), d_rstd.as<float>(), d_x.as<void>(),
        d_bias.as<float>(), d_res.as<void>(), d_gamma.as<float>(), d_beta.as<float>(), p, rng, eps,
        type, s.rows, s.c, stream.get()));
    stream.sync();
    const auto y = test::download(d_res, nn, type), v = test::download(d_v, nn, type);
    const auto mean = test::download(d_mean, rows, cuda::elem::f32);
    const auto rstd = test::download(d_rstd, rows, cuda::elem::f32);
    // v: the same explicit operations on both sides, so the same bits (mask included).
    CHECK(std::memcmp(v.data(), v_twin.data(), nn * 4) == 0);
    DSA_CHECK_CLOSE(v.data(), v_twin.data(), n,
                    test::storage_tolerance(type, test::gpu_f32_elementwise));
    DSA_CHECK_CLOSE(mean.data(), mean_twin.data(), s.rows, test::gpu_f32_reduction);
    DSA_CHECK_CLOSE(rstd.data(), rstd_twin.data(), s.rows, test::gpu_f32_reduction);
    DSA_CHECK_CLOSE(y.data(), y_twin.data(), n,
                    test::storage_tolerance(type, test::gpu_f32_reduction));
  });
}

TEST_CASE("cuda bias_dropout_residual (pre-LN's exit) and add_into equal the CPU twin bit for bit") {
  const test::test_stream stream;
  philox_stream rng;
  rng.seed = 77;
  rng.step = 3;
  rng.layer = 2;
  for_each_case([&](cuda::elem type, shape s) {
    const std::int64_t n = s.rows * s.c;
    const auto nn = static_cast<std::size_t>(n);
    for (const float p : {0.0f, 0.1f}) {
      CAPTURE(p);
      const auto x = test::round_to(random_vector(n, -2.0f, 2.0f, 81), type);
      const auto residual = test::round_to(random_vector(n, -1.0f, 1.0f, 82), type);
      const auto bias = random_vector(s.c, -0.5f, 0.5f, 83);
      std::vector<float> y_twin(nn), sum_twin(nn);
      for (std::int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        const bool keep = common::dropout_keep_element(rng, static_cast<std::uint64_t>(i), p);
        y_twin[k] = common::residual_sum_element(x[k], bias[static_cast<std::size_t>(i % s.c)], residual[k], keep,
                                                 1.0f / (1.0f - p));
      }
      y_twin = test::round_to(y_twin, type);
      for (std::size_t k = 0; k < nn; ++k)
        sum_twin[k] = y_twin[k] + x[k];
      sum_twin = test::round_to(sum_twin, type);
      device_buffer d_x(bytes_of(n, type)), d_res(bytes_of(n, type)), d_bias(bias.size() * 4);
      test::upload(d_x, test::encode(x, type));
      test::upload(d_res, test::encode(residual, type));
      test::upload(d_bias, bias);
      // y written over the residual, as the header allows.
      DSA_REQUIRE_CUDA(cuda::bias_dropout_residual(d_res.as<void>(), d_x.as<void>(), d_bias.as<float>(),
                                                   d_res.as<void>(), p, rng, type, s.rows, s.c, stream.get()));
      stream.sync();
      const auto y = test::download(d_res, nn, type);
      CHECK(std::memcmp(y.data(), y_twin.data(), nn * 4) == 0);
      // y += x, the f32 sum rounded once.
      DSA_REQUIRE_CUDA(cuda::add_into(d_res.as<void>(), d_x.as<void>(), type, n, stream.get()));
      stream.sync();
      const auto sum = test::download(d_res, nn, type);
      CHECK(std::memcmp(sum.data(), sum_twin.data(), nn * 4) == 0);
    }
  });
}

TEST_CASE("cuda layernorm_invert rebuilds a LayerNorm's input from its output, as the CPU twin") {
  const test::test_stream stream;
  const float eps = 1e-12f;
  for_each_case([&](cuda::elem type, shape s) {
    if (s.c == 1)
      return; // a one-column row normalizes to beta: nothing to invert
    const std::int64_t n = s.rows * s.c;
    const auto nn = static_cast<std::size_t>(n), rows = static_cast<std::size_t>(s.rows);
    const auto x = test::round_to(random_vector(n, -2.0f, 3.0f, 51), type);
    const auto gamma = random_vector(s.c, 0.5f, 1.5f, 52), beta = random_vector(s.c, -0.5f, 0.5f, 53);
    std::vector<float> y(nn), mean(rows), rstd(rows), twin(nn);
    for (std::int64_t r = 0; r < s.rows; ++r)
      common::layernorm_row_forward(y.data() + r * s.c, &mean[static_cast<std::size_t>(r)],
                                    &rstd[static_cast<std::size_t>(r)], x.data() + r * s.c, gamma.data(), beta.data(),
                                    eps, s.c);
    y = test::round_to(y, type);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto r = static_cast<std::size_t>(i / s.c), j = static_cast<std::size_t>(i % s.c);
      const float xhat = (y[static_cast<std::size_t>(i)] - beta[j]) * (1.0f / gamma[j]);
      twin[static_cast<std::size_t>(i)] = xhat / rstd[r] + mean[r];
    }
    twin = test::round_to(twin, type);
    device_buffer d_y(bytes_of(n, type)), d_mean(rows * 4), d_rstd(rows * 4), d_gamma(gamma.size() * 4),
        d_beta(beta.size() * 4);
    test::upload(d_y, test::encode(y, type));
    test::upload(d_mean, mean);
    test::upload(d_rstd, rstd);
    test::upload(d_gamma, gamma);
    test::upload(d_beta, beta);
    // In place (x over y), as the header allows.
    DSA_REQUIRE_CUDA(cuda::layernorm_invert(d_y.as<void>(), d_y.as<void>(), d_mean.as<float>(), d_rstd.as<float>(),
                                            d_gamma.as<float>(), d_beta.as<float>(), type, s.rows, s.c, stream.get()));
    stream.sync();
    const auto got = test::download(d_y, nn, type);
    DSA_CHECK_CLOSE(got.data(), twin.data(), n, test::storage_tolerance(type, test::gpu_f32_elementwise));
    // And close to the input it was made from (f32: the round trip's rounding only).
    if (type == cuda::elem::f32)
      DSA_CHECK_CLOSE(got.data(), x.data(), n, test::gpu_f32_reduction);
  });
}

TEST_CASE("cuda launchers reject bad sizes without launching") {
  CHECK(cuda::bias_gelu_forward(nullptr, nullptr, nullptr, cuda::elem::f32, 1, 1, nullptr) ==
        cudaErrorInvalidValue);
  CHECK(cuda::layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1e-12f,
                                cuda::elem::f32, 1, 0, nullptr) == cudaErrorInvalidValue);
  common::adam_consts c{};
  CHECK(cuda::adam_update(nullptr, nullptr, nullptr, nullptr, nullptr, cuda::elem::f16, c, -1,
                          nullptr) == cudaErrorInvalidValue);
}
