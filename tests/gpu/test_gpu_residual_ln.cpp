// The fused post-LN sublayer end's backward (kernels/cuda/residual_layernorm.hpp) against
// the CPU composition it fuses, from the values the GPU forward stored: cpu::layernorm_backward
// on the widened sum, cpu::dropout_mask and cpu::dropout_backward on the same Philox stream,
// and column sums in double for dgamma, dbeta and dbias. Also: dresidual written over dy,
// null outputs skipped, bad sizes and pointers refused without a launch; and the forward on
// rows of 8-element vectors (the register kernels) against its CPU twin.
#include "kernels/common/residual_layernorm_math.hpp"
#include "kernels/cpu/dropout.hpp"
#include "kernels/cpu/layernorm.hpp"
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
// One row; rows narrower than a warp; a prime number of rows 4 x 256 + 6 wide (threads 0..5
// take a fifth element); two rows past 4096 (off every vector and Philox block width). Then
// rows of 8-element vectors, which the kernels keep in registers, a vector per thread in
// groups of 1, 2, 3, 4, 8 and 16 warps: one vector; 33 vectors (one on the second warp);
// BERT-base's 768; BERT-large's 1024 with several steps per group (more than 132 x 8
// rows); 2048; 4096 with several steps per block.
constexpr shape shapes[] = {{1, 5},    {37, 5},   {37, 1030},   {2, 4099},  {3, 8},
                            {64, 264}, {37, 768}, {1200, 1024}, {45, 2048}, {400, 4096}};
constexpr float rates[] = {0.1f, 0.0f};
constexpr float eps = 1e-12f;

philox_stream test_rng() {
  philox_stream rng;
  rng.seed = 0x0123456789abcdefull;
  rng.step = 5;
  rng.micro_batch = 2;
  rng.layer = 9;
  rng.site = 1;
  return rng;
}

std::size_t bytes_of(std::int64_t n, cuda::elem type) {
  return static_cast<std::size_t>(n * cuda::elem_size(type));
}

// Fills a buffer with 0xff bytes: NaN in f32, f16 and bf16, so an element left unwritten fails.
void poison(device_buffer& b) {
  DSA_REQUIRE_CUDA(cudaMemset(b.as<void>(), 0xff, b.bytes()));
}

bool all_poisoned(const device_buffer& b) {
  const auto bytes = test::download_bytes(b, b.bytes());
  for (const std::uint8_t v : bytes)
    if (v != 0xff)
      return false;
  return true;
}

// One case's backward inputs: the GPU forward run on rounded random inputs; its saved sum,
// mean and rstd, with gamma and dy, on the device and read back (both sides start from them).
struct saved_forward {
  saved_forward(cuda::elem type, shape s, float p, const philox_stream& rng,
                const test::test_stream& stream);

  std::int64_t n;
  device_buffer d_dy, d_sum, d_mean, d_rstd, d_gamma;
  std::vector<float> dy, sum, mean, rstd, gamma;
};

saved_forward::saved_forward(cuda::elem type, shape s, float p, const philox_stream& rng,
                             const test::test_stream& stream)
    : n(s.rows * s.c), d_dy(bytes_of(n, type)), d_sum(bytes_of(n, type)),
      d_mean(static_cast<std::size_t>(s.rows) * 4), d_rstd(static_cast<std::size_t>(s.rows) * 4),
      d_gamma(static_cast<std::size_t>(s.c) * 4),
      dy(test::round_to(random_vector(n, -1.0f, 1.0f, 21), type)),
      gamma(random_vector(s.c, 0.5f, 1.5f, 22)) {
  const auto x = test::round_to(random_vector(n, -2.0f, 2.0f, 23), type);
  const auto residual = test::round_to(random_vector(n, -1.0f, 1.0f, 24), type);
  const auto bias = random_vector(s.c, -0.5f, 0.5f, 25), beta = random_vector(s.c, -0.5f, 0.5f, 26);
  device_buffer d_x(bytes_of(n, type)), d_res(bytes_of(n, type)), d_y(bytes_of(n, type));
  device_buffer d_bias(bias.size() * 4), d_beta(beta.size() * 4);
  test::upload(d_x, test::encode(x, type));
  test::upload(d_res, test::encode(residual, type));
  test::upload(d_bias, bias);
  test::upload(d_beta, beta);
  test::upload(d_gamma, gamma);
  test::upload(d_dy, test::encode(dy, type));
  DSA_REQUIRE_CUDA(cuda::residual_layernorm_forward(
      d_y.as<void>(), d_sum.as<void>(), d_mean.as<float>(), d_rstd.as<float>(), d_x.as<void>(),
      d_bias.as<float>(), d_res.as<void>(), d_gamma.as<float>(), d_beta.as<float>(), p, rng, eps,
      type, s.rows, s.c, stream.get()));
  stream.sync();
  sum = test::download(d_sum, static_cast<std::size_t>(n), type);
  mean = test::download(d_mean, static_cast<std::size_t>(s.rows), cuda::elem::f32);
  rstd = test::download(d_rstd, static_cast<std::size_t>(s.rows), cuda::elem::f32);
}

// The CPU composition: dsum and dx in f32 (before rounding to the storage type), the mask,
// and the preloaded column gradients plus their column sums in double.
struct reference {
  std::vector<float> dsum, dx;
  std::vector<std::uint8_t> mask;
  std::vector<double> dgamma, dbeta, dbias;
};

reference backward_reference(const saved_forward& f, shape s, float p, const philox_stream& rng,
                             const std::vector<float>& dgamma0, const std::vector<float>& dbeta0,
                             const std::vector<float>& dbias0) {
  const auto nn = static_cast<std::size_t>(f.n);
  reference r;
  r.dsum.resize(nn);
  r.dx.resize(nn);
  r.mask.resize(nn);
  std::vector<float> unused_dgamma(f.gamma.size(), 0.0f), unused_dbeta(f.gamma.size(), 0.0f);
  cpu::layernorm_backward(r.dsum.data(), unused_dgamma.data(), unused_dbeta.data(), f.dy.data(),
                          f.sum.data(), f.mean.data(), f.rstd.data(), f.gamma.data(), s.rows, s.c);
  cpu::dropout_mask(r.mask.data(), p, rng, f.n);
  cpu::dropout_backward(r.dx.data(), r.dsum.data(), r.mask.data(), p, f.n);
  r.dgamma.assign(dgamma0.begin(), dgamma0.end());
  r.dbeta.assign(dbeta0.begin(), dbeta0.end());
  r.dbias.assign(dbias0.begin(), dbias0.end());
  for (std::int64_t row = 0; row < s.rows; ++row) {
    const auto k = static_cast<std::size_t>(row);
    for (std::int64_t j = 0; j < s.c; ++j) {
      const auto i = static_cast<std::size_t>(row * s.c + j), u = static_cast<std::size_t>(j);
      const double xhat = (static_cast<double>(f.sum[i]) - f.mean[k]) * f.rstd[k];
      r.dgamma[u] += f.dy[i] * xhat;
      r.dbeta[u] += f.dy[i];
      r.dbias[u] += r.dx[i];
    }
  }
  return r;
}

} // namespace

TEST_CASE("cuda residual layernorm backward matches the CPU composition, mask included") {
  const test::test_stream stream;
  const philox_stream rng = test_rng();
  for (auto type : all_types) {
    for (auto s : shapes) {
      for (float p : rates) {
        INFO(std::string(test::elem_name(type)) << " rows=" << s.rows << " c=" << s.c << " p=" << p);
        const saved_forward f(type, s, p, rng, stream);
        const auto nn = static_cast<std::size_t>(f.n), cc = static_cast<std::size_t>(s.c);
        // Nonzero starting values: the column gradients accumulate.
        const auto dgamma0 = random_vector(s.c, -1.0f, 1.0f, 31);
        const auto dbeta0 = random_vector(s.c, -1.0f, 1.0f, 32);
        const auto dbias0 = random_vector(s.c, -1.0f, 1.0f, 33);
        const reference ref = backward_reference(f, s, p, rng, dgamma0, dbeta0, dbias0);

        device_buffer d_dres(bytes_of(f.n, type)), d_dx(bytes_of(f.n, type));
        device_buffer d_dgamma(cc * 4), d_dbeta(cc * 4), d_dbias(cc * 4);
        poison(d_dres);
        poison(d_dx);
        test::upload(d_dgamma, dgamma0);
        test::upload(d_dbeta, dbeta0);
        test::upload(d_dbias, dbias0);
        DSA_REQUIRE_CUDA(cuda::residual_layernorm_backward(
            d_dres.as<void>(), d_dx.as<void>(), d_dgamma.as<float>(), d_dbeta.as<float>(),
            d_dbias.as<float>(), f.d_dy.as<void>(), f.d_sum.as<void>(), f.d_mean.as<float>(),
            f.d_rstd.as<float>(), f.d_gamma.as<float>(), p, rng, type, s.rows, s.c, stream.get()));
        stream.sync();
        const auto dres = test::download(d_dres, nn, type), dx = test::download(d_dx, nn, type);
        const auto dgamma = test::download(d_dgamma, cc, cuda::elem::f32);
        const auto dbeta = test::download(d_dbeta, cc, cuda::elem::f32);
        const auto dbias = test::download(d_dbias, cc, cuda::elem::f32);

        const auto dsum_stored = test::round_to(ref.dsum, type);
        const auto dx_stored = test::round_to(ref.dx, type);
        const auto tol = test::storage_tolerance(type, test::gpu_f32_reduction);
        DSA_CHECK_CLOSE(dres.data(), dsum_stored.data(), f.n, tol);
        DSA_CHECK_CLOSE(dx.data(), dx_stored.data(), f.n, tol);
        // The mask: every element the CPU drops is exactly zero on the GPU too.
        std::int64_t dropped = 0, dropped_nonzero = 0;
        for (std::size_t i = 0; i < nn; ++i) {
          if (ref.mask[i] == 0) {
            ++dropped;
            if (dx[i] != 0.0f)
              ++dropped_nonzero;
          }
        }
        CHECK(dropped_nonzero == 0);
        if (p > 0.0f && f.n >= 1000)
          CHECK(dropped > 0); // the case exercises dropping at all
        if (p == 0.0f) {
          CHECK(dropped == 0);
          CHECK(std::memcmp(dx.data(), dres.data(), nn * 4) == 0); // dx = dsum
        }
        DSA_CHECK_CLOSE(dgamma.data(), ref.dgamma.data(), s.c, test::gpu_f32_reduction);
        DSA_CHECK_CLOSE(dbeta.data(), ref.dbeta.data(), s.c, test::gpu_f32_reduction);
        DSA_CHECK_CLOSE(dbias.data(), ref.dbias.data(), s.c, test::gpu_f32_reduction);
      }
    }
  }
}

TEST_CASE("cuda residual layernorm backward writes dresidual over dy and skips null outputs") {
  const test::test_stream stream;
  const philox_stream rng = test_rng();
  const float p = 0.1f;
  // Element by element, and in registers.
  for (const shape s : {shape{37, 1030}, shape{37, 1024}})
    for (auto type : all_types) {
      INFO(std::string(test::elem_name(type)) << " c=" << s.c);
      const saved_forward f(type, s, p, rng, stream);
      const auto cc = static_cast<std::size_t>(s.c);
      const std::size_t bytes = bytes_of(f.n, type);
      auto backward = [&](void* dres, void* dx, float* dgamma, float* dbeta, float* dbias) {
        DSA_REQUIRE_CUDA(cuda::residual_layernorm_backward(
            dres, dx, dgamma, dbeta, dbias, f.d_dy.as<void>(), f.d_sum.as<void>(),
            f.d_mean.as<float>(), f.d_rstd.as<float>(), f.d_gamma.as<float>(), p, rng, type, s.rows,
            s.c, stream.get()));
      };
      // Every output, in separate buffers.
      device_buffer d_dres(bytes), d_dx(bytes), d_dgamma(cc * 4), d_dbeta(cc * 4), d_dbias(cc * 4);
      DSA_REQUIRE_CUDA(cudaMemset(d_dgamma.as<void>(), 0, d_dgamma.bytes()));
      DSA_REQUIRE_CUDA(cudaMemset(d_dbeta.as<void>(), 0, d_dbeta.bytes()));
      DSA_REQUIRE_CUDA(cudaMemset(d_dbias.as<void>(), 0, d_dbias.bytes()));
      backward(d_dres.as<void>(), d_dx.as<void>(), d_dgamma.as<float>(), d_dbeta.as<float>(),
               d_dbias.as<float>());
      // dx alone besides dresidual: the same bits (rows are reduced in a fixed order).
      device_buffer d_dres_alone(bytes), d_dx_alone(bytes);
      poison(d_dres_alone);
      poison(d_dx_alone);
      backward(d_dres_alone.as<void>(), d_dx_alone.as<void>(), nullptr, nullptr, nullptr);
      // dresidual over dy, no dx, dbias alone of the column sums (it still needs the mask).
      device_buffer d_dbias_alone(cc * 4);
      DSA_REQUIRE_CUDA(cudaMemset(d_dbias_alone.as<void>(), 0, d_dbias_alone.bytes()));
      backward(f.d_dy.as<void>(), nullptr, nullptr, nullptr, d_dbias_alone.as<float>());
      stream.sync();

      const auto dres = test::download_bytes(d_dres, bytes);
      CHECK(test::download_bytes(d_dres_alone, bytes) == dres);
      CHECK(test::download_bytes(d_dx_alone, bytes) == test::download_bytes(d_dx, bytes));
      CHECK(test::download_bytes(f.d_dy, bytes) == dres);
      const auto dbias = test::download(d_dbias, cc, cuda::elem::f32);
      const auto dbias_alone = test::download(d_dbias_alone, cc, cuda::elem::f32);
      DSA_CHECK_CLOSE(dbias_alone.data(), dbias.data(), s.c, test::gpu_f32_reduction);
    }
}

// The forward of the rows kept in registers (8-element vectors), against the CPU twin as in
// test_gpu_kernels.cpp: y written over the residual; v the same bits. Also with bias, gamma
// and beta off their 16-byte alignment (loaded one float at a time), and with rows off
// their vector alignment (the element-by-element kernel).
TEST_CASE("cuda residual layernorm forward on 8-wide rows matches the CPU twin, mask included") {
  const test::test_stream stream;
  const philox_stream rng = test_rng();
  // One vector; 33 vectors (lane 0 takes two); BERT-base and -large; 161 vectors over 3
  // warps (two for the first 33 threads); 257 over 4 warps (three for the first); 4096.
  constexpr shape forward_shapes[] = {{1, 8},    {37, 264}, {7, 768}, {33, 1024},
                                      {5, 1288}, {3, 2056}, {2, 4096}};
  enum class layout { aligned, columns_off, rows_off };
  for (auto type : all_types) {
    for (auto s : forward_shapes) {
      for (float p : rates) {
        for (const layout l : {layout::aligned, layout::columns_off, layout::rows_off}) {
          if (l != layout::aligned && s.c != 1024)
            continue;
          INFO(std::string(test::elem_name(type)) << " rows=" << s.rows << " c=" << s.c << " p="
                                                  << p << " layout=" << static_cast<int>(l));
          const std::int64_t n = s.rows * s.c;
          const auto nn = static_cast<std::size_t>(n), rows = static_cast<std::size_t>(s.rows);
          const auto x = test::round_to(random_vector(n, -2.0f, 2.0f, 91), type);
          const auto residual = test::round_to(random_vector(n, -1.0f, 1.0f, 92), type);
          const auto bias = random_vector(s.c, -0.5f, 0.5f, 93),
                     gamma = random_vector(s.c, 0.5f, 1.5f, 94);
          const auto beta = random_vector(s.c, -0.5f, 0.5f, 95);
          std::vector<float> y_twin(nn), v_twin(nn), mean_twin(rows), rstd_twin(rows);
          for (std::int64_t r = 0; r < s.rows; ++r)
            common::residual_layernorm_row_forward(
                y_twin.data() + r * s.c, v_twin.data() + r * s.c,
                &mean_twin[static_cast<std::size_t>(r)], &rstd_twin[static_cast<std::size_t>(r)],
                x.data() + r * s.c, bias.data(), residual.data() + r * s.c, gamma.data(),
                beta.data(), p, rng, static_cast<std::uint64_t>(r * s.c), eps, s.c);
          y_twin = test::round_to(y_twin, type);
          v_twin = test::round_to(v_twin, type);
          // Offsets in elements: one past an aligned start breaks the alignment asked for.
          const std::int64_t row_off = l == layout::rows_off ? 1 : 0;
          const std::int64_t col_off = l == layout::columns_off ? 1 : 0;
          device_buffer d_x(bytes_of(n + row_off, type)), d_res(bytes_of(n + row_off, type)),
              d_v(bytes_of(n + row_off, type));
          device_buffer d_bias((bias.size() + 1) * 4), d_gamma((gamma.size() + 1) * 4),
              d_beta((beta.size() + 1) * 4);
          device_buffer d_mean(rows * 4), d_rstd(rows * 4);
          const auto row_bytes = static_cast<std::size_t>(row_off * cuda::elem_size(type));
          auto at = [&](const device_buffer& b) { return b.as<std::uint8_t>() + row_bytes; };
          auto upload_at = [&](std::uint8_t* dst, const std::vector<std::uint8_t>& src) {
            DSA_REQUIRE_CUDA(cudaMemcpy(dst, src.data(), src.size(), cudaMemcpyHostToDevice));
          };
          upload_at(at(d_x), test::encode(x, type));
          upload_at(at(d_res), test::encode(residual, type));
          DSA_REQUIRE_CUDA(cudaMemcpy(d_bias.as<float>() + col_off, bias.data(), bias.size() * 4,
                                      cudaMemcpyHostToDevice));
          DSA_REQUIRE_CUDA(cudaMemcpy(d_gamma.as<float>() + col_off, gamma.data(), gamma.size() * 4,
                                      cudaMemcpyHostToDevice));
          DSA_REQUIRE_CUDA(cudaMemcpy(d_beta.as<float>() + col_off, beta.data(), beta.size() * 4,
                                      cudaMemcpyHostToDevice));
          poison(d_v);
          DSA_REQUIRE_CUDA(cuda::residual_layernorm_forward(
              at(d_res), at(d_v), d_mean.as<float>(), d_rstd.as<float>(), at(d_x),
              d_bias.as<float>() + col_off, at(d_res), d_gamma.as<float>() + col_off,
              d_beta.as<float>() + col_off, p, rng, eps, type, s.rows, s.c, stream.get()));
          stream.sync();
          std::vector<std::uint8_t> y_bytes(bytes_of(n, type)), v_bytes(bytes_of(n, type));
          DSA_REQUIRE_CUDA(
              cudaMemcpy(y_bytes.data(), at(d_res), y_bytes.size(), cudaMemcpyDeviceToHost));
          DSA_REQUIRE_CUDA(
              cudaMemcpy(v_bytes.data(), at(d_v), v_bytes.size(), cudaMemcpyDeviceToHost));
          const auto y = test::decode(y_bytes, type), v = test::decode(v_bytes, type);
          const auto mean = test::download(d_mean, rows, cuda::elem::f32);
          const auto rstd = test::download(d_rstd, rows, cuda::elem::f32);
          CHECK(std::memcmp(v.data(), v_twin.data(), nn * 4) == 0);
          DSA_CHECK_CLOSE(v.data(), v_twin.data(), n,
                          test::storage_tolerance(type, test::gpu_f32_elementwise));
          DSA_CHECK_CLOSE(mean.data(), mean_twin.data(), s.rows, test::gpu_f32_reduction);
          DSA_CHECK_CLOSE(rstd.data(), rstd_twin.data(), s.rows, test::gpu_f32_reduction);
          DSA_CHECK_CLOSE(y.data(), y_twin.data(), n,
                          test::storage_tolerance(type, test::gpu_f32_reduction));
        }
      }
    }
  }
}

namespace {

// The arguments of one refused call, a valid (rows, c) = (2, 5) call until a field is spoiled.
struct backward_args {
  void* dresidual = nullptr;
  void* dx = nullptr;
  const void* dy = nullptr;
  const void* sum = nullptr;
  const float* mean = nullptr;
  const float* rstd = nullptr;
  const float* gamma = nullptr;
  float p = 0.1f;
  cuda::elem type = cuda::elem::f32;
  std::int64_t rows = 2, c = 5;
};

cudaError_t run_backward(const backward_args& a, const test::test_stream& stream) {
  return cuda::residual_layernorm_backward(a.dresidual, a.dx, nullptr, nullptr, nullptr, a.dy,
                                           a.sum, a.mean, a.rstd, a.gamma, a.p, test_rng(), a.type,
                                           a.rows, a.c, stream.get());
}

} // namespace

TEST_CASE("cuda residual layernorm backward refuses bad sizes and pointers without launching") {
  const test::test_stream stream;
  constexpr std::int64_t rows = 2, c = 5, n = rows * c;
  device_buffer d_dres(n * 4), d_dx(n * 4), d_dy(n * 4), d_sum(n * 4);
  device_buffer d_mean(rows * 4), d_rstd(rows * 4), d_gamma(c * 4);
  test::upload(d_dy, random_vector(n, -1.0f, 1.0f, 41));
  test::upload(d_sum, random_vector(n, -1.0f, 1.0f, 42));
  test::upload(d_mean, std::vector<float>(rows, 0.0f));
  test::upload(d_rstd, std::vector<float>(rows, 1.0f));
  test::upload(d_gamma, random_vector(c, 0.5f, 1.5f, 43));
  poison(d_dres);
  poison(d_dx);
  backward_args good;
  good.dresidual = d_dres.as<void>();
  good.dx = d_dx.as<void>();
  good.dy = d_dy.as<void>();
  good.sum = d_sum.as<void>();
  good.mean = d_mean.as<float>();
  good.rstd = d_rstd.as<float>();
  good.gamma = d_gamma.as<float>();

  auto refused = [&](auto spoil) {
    backward_args a = good;
    spoil(a);
    return run_backward(a, stream) == cudaErrorInvalidValue;
  };
  CHECK(refused([](backward_args& a) { a.rows = -1; }));
  CHECK(refused([](backward_args& a) { a.rows = std::int64_t{1} << 31; }));
  CHECK(refused([](backward_args& a) { a.c = 0; }));
  CHECK(refused([](backward_args& a) { a.c = -5; }));
  // More elements than a Philox stream's 2^32 blocks of four (rows c past 2^34).
  CHECK(refused([](backward_args& a) { a.c = (std::int64_t{1} << 33) + 1; }));
  CHECK(refused([](backward_args& a) {
    a.rows = 1;
    a.c = (std::int64_t{1} << 34) + 1;
  }));
  CHECK(refused([](backward_args& a) { a.p = 1.0f; }));
  CHECK(refused([](backward_args& a) { a.p = -0.25f; }));
  CHECK(refused([](backward_args& a) { a.p = std::numeric_limits<float>::quiet_NaN(); }));
  CHECK(refused([](backward_args& a) { a.dresidual = nullptr; }));
  CHECK(refused([](backward_args& a) { a.dy = nullptr; }));
  CHECK(refused([](backward_args& a) { a.sum = nullptr; }));
  CHECK(refused([](backward_args& a) { a.mean = nullptr; }));
  CHECK(refused([](backward_args& a) { a.rstd = nullptr; }));
  CHECK(refused([](backward_args& a) { a.gamma = nullptr; }));
  CHECK(refused([](backward_args& a) { a.dx = const_cast<void*>(a.dy); }));
  CHECK(refused([](backward_args& a) { a.dx = a.dresidual; }));
  CHECK(refused([](backward_args& a) { a.type = static_cast<cuda::elem>(7); }));
  backward_args empty = good;
  empty.rows = 0;
  CHECK(run_backward(empty, stream) == cudaSuccess);
  stream.sync();
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(all_poisoned(d_dres)); // nothing ran
  CHECK(all_poisoned(d_dx));

  // The unspoiled call runs and writes both outputs: the refusals above were the checks'.
  DSA_REQUIRE_CUDA(run_backward(good, stream));
  stream.sync();
  const auto dres = test::download(d_dres, n, cuda::elem::f32);
  const auto dx = test::download(d_dx, n, cuda::elem::f32);
  for (std::int64_t i = 0; i < n; ++i) {
    CHECK(std::isfinite(dres[static_cast<std::size_t>(i)]));
    CHECK(std::isfinite(dx[static_cast<std::size_t>(i)]));
  }
}
