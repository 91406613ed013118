// The fixed-order column and row sums against their CPU twins: the bias gradient
// (kernels/cuda/bias.hpp) and the deterministic mode's LayerNorm parameter gradients and
// embedding row scatter (kernels/cuda/ordered_sums.hpp), at awkward and BERT-large sizes,
// with misaligned inputs, the same bits every run.
#include "kernels/cpu/bias.hpp"
#include "kernels/cuda/bias.hpp"
#include "kernels/cuda/ordered_sums.hpp"

#include "tests/gpu/gpu_test_util.hpp"
#include "tests/gpu/kernel_cases.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/random.hpp"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

using namespace dsa;
using test::all_types;
using test::bytes_of;
using test::device_buffer;
using test::for_each_case;
using test::random_vector;
using test::shape;

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
