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
#include "kernels/cuda/residual.hpp"
#include "kernels/cuda/residual_layernorm.hpp"

#include "tests/gpu/gpu_test_util.hpp"
#include "tests/gpu/kernel_cases.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/random.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

using namespace dsa;
using test::device_buffer;
using test::random_vector;

using test::all_types;
using test::bytes_of;
using test::for_each_case;
using test::shape;

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
