// kernels/cpu/gemm: OpenBLAS paths against the double-accumulating reference,
// over every transpose, packed and padded leading dimensions, awkward sizes,
// batches with strides, and f16/bf16 operands; batches spread over threads (and
// called from several threads at once) against sequential calls, bit for bit.
#include "core/half.hpp"
#include "kernels/cpu/gemm.hpp"
#include "tests/support/compare.hpp"

#include <doctest/doctest.h>

#include <cblas.h>
#include <omp.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using dsa::cpu::gemm_batch;
using dsa::cpu::gemm_shape;
using dsa::cpu::transpose;

// A stored (rows, cols) matrix with row stride ld: padding is NaN so a read
// outside the matrix poisons the result.
std::vector<float> random_matrix(std::int64_t rows, std::int64_t cols, std::int64_t ld,
                                 std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const std::int64_t size = rows == 0 ? 0 : (rows - 1) * ld + cols;
  std::vector<float> m(static_cast<std::size_t>(std::max<std::int64_t>(size, 1)), NAN);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      m[static_cast<std::size_t>(r * ld + c)] = dist(rng);
  return m;
}

struct operands {
  std::vector<float> a, b, c;
  gemm_shape shape; // leading dimensions explicit
};

// Operands for shape (ld of 0 means packed; pad adds that many columns of NaN padding to every ld).
operands make_operands(gemm_shape shape, std::int64_t pad, bool c_is_nan, std::mt19937& rng) {
  const bool ta = shape.trans_a == transpose::yes, tb = shape.trans_b == transpose::yes;
  const std::int64_t rows_a = ta ? shape.k : shape.m, cols_a = ta ? shape.m : shape.k;
  const std::int64_t rows_b = tb ? shape.n : shape.k, cols_b = tb ? shape.k : shape.n;
  if (pad > 0) {
    shape.lda = cols_a + pad;
    shape.ldb = cols_b + pad;
    shape.ldc = shape.n + pad;
  }
  operands o;
  o.shape = shape;
  o.a = random_matrix(rows_a, cols_a, shape.lda ? shape.lda : cols_a, rng);
  o.b = random_matrix(rows_b, cols_b, shape.ldb ? shape.ldb : cols_b, rng);
  o.c = random_matrix(shape.m, shape.n, shape.ldc ? shape.ldc : shape.n, rng);
  if (c_is_nan)
    for (auto& x : o.c)
      x = NAN;
  return o;
}

std::string describe(const gemm_shape& s) {
  return fmt::format("m={} n={} k={} ta={} tb={} lda={} ldb={} ldc={} alpha={} beta={}", s.m, s.n,
                     s.k, s.trans_a == transpose::yes, s.trans_b == transpose::yes, s.lda, s.ldb,
                     s.ldc, s.alpha, s.beta);
}

struct mnk {
  std::int64_t m, n, k;
};
const mnk sizes[] = {{1, 1, 1},    {37, 131, 13}, {7, 9, 1},    {1, 37, 131},
                     {131, 1, 37}, {64, 48, 33},  {13, 29, 100}};

} // namespace

TEST_CASE("gemm: reference on a hand-computed example") {
  // [1 2 3; 4 5 6] * [1 0; 0 1; 1 1] = [4 5; 10 11]
  const float a[] = {1, 2, 3, 4, 5, 6}, b[] = {1, 0, 0, 1, 1, 1};
  float c[] = {NAN, NAN, NAN, NAN};
  gemm_shape s;
  s.m = 2;
  s.n = 2;
  s.k = 3;
  dsa::cpu::gemm_ref(c, a, b, s);
  const float expected[] = {4, 5, 10, 11};
  DSA_CHECK_CLOSE(c, expected, 4, dsa::test::f32_gemm);
  float d[] = {NAN, NAN, NAN, NAN};
  dsa::cpu::gemm(d, a, b, s);
  DSA_CHECK_CLOSE(d, expected, 4, dsa::test::f32_gemm);
}

TEST_CASE("gemm: all transposes, packed and padded leading dimensions, alpha and beta") {
  std::mt19937 rng(1);
  struct scale {
    float alpha, beta;
  };
  const scale scales[] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {-0.75f, 0.5f}};
  for (const auto& size : sizes)
    for (transpose ta : {transpose::no, transpose::yes})
      for (transpose tb : {transpose::no, transpose::yes})
        for (std::int64_t pad : {0, 3})
          for (const auto& sc : scales) {
            gemm_shape s;
            s.m = size.m;
            s.n = size.n;
            s.k = size.k;
            s.trans_a = ta;
            s.trans_b = tb;
            s.alpha = sc.alpha;
            s.beta = sc.beta;
            // beta == 0 must overwrite C even when it holds NaN.
            auto o = make_operands(s, pad, sc.beta == 0.0f, rng);
            INFO(describe(o.shape));
            std::vector<float> expected = o.c;
            dsa::cpu::gemm_ref(expected.data(), o.a.data(), o.b.data(), o.shape);
            dsa::cpu::gemm(o.c.data(), o.a.data(), o.b.data(), o.shape);
            // The whole buffer: row padding of C must be left as it was (NaN on both sides).
            DSA_CHECK_CLOSE(o.c.data(), expected.data(), static_cast<std::int64_t>(o.c.size()),
                            dsa::test::f32_gemm);
          }
}

TEST_CASE("gemm: empty sizes") {
  std::mt19937 rng(2);
  SUBCASE("k = 0 leaves beta * C; beta = 0 clears NaN") {
    for (float beta : {0.0f, 0.5f}) {
      gemm_shape s;
      s.m = 5;
      s.n = 7;
      s.k = 0;
      s.beta = beta;
      auto o = make_operands(s, 0, beta == 0.0f, rng);
      std::vector<float> expected(o.c.size());
      for (std::size_t i = 0; i < o.c.size(); ++i)
        expected[i] = beta == 0.0f ? 0.0f : beta * o.c[i];
      std::vector<float> by_ref = o.c;
      dsa::cpu::gemm_ref(by_ref.data(), o.a.data(), o.b.data(), s);
      dsa::cpu::gemm(o.c.data(), o.a.data(), o.b.data(), s);
      INFO("beta " << beta);
      DSA_CHECK_CLOSE(o.c.data(), expected.data(), 35, dsa::test::f32_gemm);
      DSA_CHECK_CLOSE(by_ref.data(), expected.data(), 35, dsa::test::f32_gemm);
    }
  }
  SUBCASE("m = 0 or n = 0 touches nothing") {
    for (const mnk& size : {mnk{0, 4, 3}, mnk{4, 0, 3}, mnk{0, 0, 0}}) {
      gemm_shape s;
      s.m = size.m;
      s.n = size.n;
      s.k = size.k;
      std::vector<float> a(16, 1.0f), b(16, 1.0f), c(16, 7.0f);
      dsa::cpu::gemm(c.data(), a.data(), b.data(), s);
      dsa::cpu::gemm_batched(c.data(), a.data(), b.data(), s, gemm_batch{3, 0, 0, 0});
      for (float x : c)
        CHECK(x == 7.0f);
    }
  }
}

TEST_CASE("gemm: batched with strides, gaps and a broadcast operand") {
  std::mt19937 rng(3);
  for (transpose ta : {transpose::no, transpose::yes})
    for (transpose tb : {transpose::no, transpose::yes})
      for (std::int64_t pad : {0, 2}) {
        gemm_shape s;
        s.m = 13;
        s.n = 37;
        s.k = 9;
        s.trans_a = ta;
        s.trans_b = tb;
        s.beta = pad == 0 ? 0.0f : 1.0f;
        const std::int64_t count = 3;
        // One matrix of each operand, to learn the extents; then batches laid out with gaps.
        auto one = make_operands(s, pad, false, rng);
        const auto size_a = static_cast<std::int64_t>(one.a.size());
        const auto size_b = static_cast<std::int64_t>(one.b.size());
        const auto size_c = static_cast<std::int64_t>(one.c.size());
        for (bool broadcast_b : {false, true}) {
          gemm_batch batch{count, size_a + 5, broadcast_b ? 0 : size_b + 1, size_c + 11};
          auto fill = [&](std::int64_t stride, std::int64_t size) {
            std::vector<float> v(static_cast<std::size_t>(stride * (count - 1) + size), NAN);
            std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
            for (std::int64_t i = 0; i < count; ++i)
              for (std::int64_t j = 0; j < size; ++j)
                v[static_cast<std::size_t>(i * stride + j)] = dist(rng);
            return v;
          };
          std::vector<float> a = fill(batch.stride_a, size_a), b = fill(batch.stride_b, size_b);
          std::vector<float> c = fill(batch.stride_c, size_c);
          // Restore NaN row padding in A and B so stray reads show.
          auto repad = [&](std::vector<float>& v, std::int64_t stride,
                           const std::vector<float>& pattern) {
            for (std::int64_t i = 0; i < count; ++i)
              for (std::size_t j = 0; j < pattern.size(); ++j)
                if (std::isnan(pattern[j]))
                  v[static_cast<std::size_t>(i * stride) + j] = NAN;
          };
          repad(a, batch.stride_a, one.a);
          repad(b, batch.stride_b, one.b);
          INFO(describe(one.shape) << " broadcast_b " << broadcast_b);
          std::vector<float> expected = c;
          dsa::cpu::gemm_ref(expected.data(), a.data(), b.data(), one.shape, batch);
          dsa::cpu::gemm_batched(c.data(), a.data(), b.data(), one.shape, batch);
          DSA_CHECK_CLOSE(c.data(), expected.data(), static_cast<std::int64_t>(c.size()),
                          dsa::test::f32_gemm);
        }
      }
}

TEST_CASE("gemm: f16 and bf16 operands equal the f32 GEMM of the converted operands") {
  std::mt19937 rng(4);
  for (dsa::dtype type : {dsa::dtype::f16, dsa::dtype::bf16})
    for (const auto& size : sizes)
      for (transpose ta : {transpose::no, transpose::yes})
        for (transpose tb : {transpose::no, transpose::yes})
          for (std::int64_t pad : {0, 3}) {
            gemm_shape s;
            s.m = size.m;
            s.n = size.n;
            s.k = size.k;
            s.trans_a = ta;
            s.trans_b = tb;
            s.alpha = 0.5f;
            s.beta = pad == 0 ? 0.0f : 1.0f;
            auto o = make_operands(s, pad, false, rng);
            // Round the operands to the half type (padding NaN stays NaN), and back exactly.
            auto to_half = [&](const std::vector<float>& v, std::vector<float>& widened) {
              std::vector<std::uint16_t> h(v.size());
              widened.resize(v.size());
              for (std::size_t i = 0; i < v.size(); ++i) {
                h[i] = type == dsa::dtype::f16 ? dsa::f32_to_f16(v[i]) : dsa::f32_to_bf16(v[i]);
                widened[i] =
                    type == dsa::dtype::f16 ? dsa::f16_to_f32(h[i]) : dsa::bf16_to_f32(h[i]);
              }
              return h;
            };
            std::vector<float> a32, b32;
            const auto a16 = to_half(o.a, a32);
            const auto b16 = to_half(o.b, b32);
            INFO(std::string(dsa::dtype_name(type)) << " " << describe(o.shape));
            std::vector<float> expected = o.c;
            dsa::cpu::gemm_ref(expected.data(), a32.data(), b32.data(), o.shape);
            dsa::cpu::gemm(o.c.data(), dsa::cpu::gemm_operand{a16.data(), type}, dsa::cpu::gemm_operand{b16.data(), type}, o.shape);
            DSA_CHECK_CLOSE(o.c.data(), expected.data(), static_cast<std::int64_t>(o.c.size()),
                            dsa::test::f32_gemm);
          }
}

namespace {

// Attention-like batches: heads as column blocks of (T, H) rows (context = P V, with C blocks
// side by side), (T, T) score blocks (Q K^T), and separate transposed matrices.
struct batch_case {
  const char* name;
  gemm_shape shape;
  gemm_batch batch;
  std::int64_t size_a, size_b, size_c;
};

std::vector<batch_case> batch_cases() {
  const std::int64_t heads = 7, t = 37, d = 16, h = heads * d;
  std::vector<batch_case> cases;
  gemm_shape qk;
  qk.m = t, qk.n = t, qk.k = d, qk.trans_b = transpose::yes, qk.lda = h, qk.ldb = h, qk.ldc = t;
  cases.push_back({"q k^T", qk, {heads, d, d, t * t}, t * h, t * h, heads * t * t});
  gemm_shape pv;
  pv.m = t, pv.n = d, pv.k = t, pv.lda = t, pv.ldb = h, pv.ldc = h;
  cases.push_back(
      {"p v into column blocks", pv, {heads, t * t, d, d}, heads * t * t, t * h, t * h});
  gemm_shape tt;
  tt.m = 29, tt.n = 13, tt.k = 41, tt.trans_a = transpose::yes, tt.trans_b = transpose::yes;
  tt.alpha = 0.5f, tt.beta = 1.0f;
  cases.push_back({"separate, both transposed, beta 1",
                   tt,
                   {5, 29 * 41, 0, 29 * 13 + 3},
                   5 * 29 * 41,
                   13 * 41,
                   5 * (29 * 13 + 3)});
  return cases;
}

std::vector<float> uniform(std::int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v)
    x = dist(rng);
  return v;
}

// C from one gemm() per entry, in order: the sequential result.
std::vector<float> sequential(const batch_case& bc, const std::vector<float>& a,
                              const std::vector<float>& b, std::vector<float> c) {
  for (std::int64_t i = 0; i < bc.batch.count; ++i)
    dsa::cpu::gemm(c.data() + i * bc.batch.stride_c, a.data() + i * bc.batch.stride_a,
                   b.data() + i * bc.batch.stride_b, bc.shape);
  return c;
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

} // namespace

TEST_CASE("gemm: batched entries on several threads equal sequential calls bit for bit") {
  const int saved_omp = omp_get_max_threads();
  omp_set_num_threads(3); // the threaded path even on a one-core machine
  std::mt19937 rng(5);
  for (const auto& bc : batch_cases()) {
    INFO(bc.name << ": " << describe(bc.shape));
    const auto a = uniform(bc.size_a, rng), b = uniform(bc.size_b, rng),
               c0 = uniform(bc.size_c, rng);
    const auto expected = sequential(bc, a, b, c0);
    auto c = c0;
    dsa::cpu::gemm_batched(c.data(), a.data(), b.data(), bc.shape, bc.batch);
    CHECK(same_bits(c, expected));
    CHECK(openblas_get_num_threads() == 1); // dsactor threads GEMMs itself
  }
  omp_set_num_threads(saved_omp);
}

TEST_CASE("gemm: batched from several threads at once (pipeline stages) equal sequential calls") {
  std::mt19937 rng(6);
  const auto cases = batch_cases();
  struct job {
    const batch_case* bc;
    std::vector<float> a, b, c0, expected;
  };
  std::vector<job> jobs;
  for (int i = 0; i < 4; ++i) {
    const batch_case& bc = cases[static_cast<std::size_t>(i) % cases.size()];
    job j{&bc, uniform(bc.size_a, rng), uniform(bc.size_b, rng), uniform(bc.size_c, rng), {}};
    j.expected = sequential(bc, j.a, j.b, j.c0);
    jobs.push_back(std::move(j));
  }
  std::vector<int> mismatches(jobs.size(), 0);
  std::vector<std::thread> callers;
  for (std::size_t i = 0; i < jobs.size(); ++i)
    callers.emplace_back([&, i] {
      omp_set_num_threads(2);
      const job& j = jobs[i];
      for (int rep = 0; rep < 20; ++rep) {
        auto c = j.c0;
        dsa::cpu::gemm_batched(c.data(), j.a.data(), j.b.data(), j.bc->shape, j.bc->batch);
        mismatches[i] += same_bits(c, j.expected) ? 0 : 1;
      }
    });
  for (auto& t : callers)
    t.join();
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    INFO("caller " << i << " (" << jobs[i].bc->name << ")");
    CHECK(mismatches[i] == 0);
  }
}

// Two identical runs once differed in the 8th digit: OpenBLAS chose its kernels by a
// process-wide thread count that concurrent stages changed. A GEMM's bits now depend on its
// shape and operands only.
TEST_CASE("gemm: a result depends on the shape only, not on the threads, a parallel region or other callers") {
  const int saved_omp = omp_get_max_threads();
  std::mt19937 rng(8);
  struct big {
    dsa::cpu::gemm_shape s;
  };
  std::vector<big> shapes;
  for (auto [m, n, k] : {std::array<std::int64_t, 3>{512, 384, 256}, {300, 129, 517}, {64, 1024, 64}, {17, 33, 4000}}) {
    dsa::cpu::gemm_shape s;
    s.m = m;
    s.n = n;
    s.k = k;
    shapes.push_back({s});
  }
  for (const auto& sh : shapes) {
    const auto& s = sh.s;
    INFO(describe(s));
    const auto a = uniform(static_cast<std::size_t>(s.m * s.k), rng), b = uniform(static_cast<std::size_t>(s.k * s.n), rng);
    auto run = [&] {
      std::vector<float> c(static_cast<std::size_t>(s.m * s.n), 0.0f);
      dsa::cpu::gemm(c.data(), a.data(), b.data(), s);
      return c;
    };
    omp_set_num_threads(1);
    const auto one = run();
    omp_set_num_threads(3);
    CHECK(same_bits(run(), one));
    std::vector<float> nested;
#pragma omp parallel num_threads(2)
    {
#pragma omp single
      nested = run();
    }
    CHECK(same_bits(nested, one));
    // Other threads' GEMMs running at the same time change nothing.
    std::vector<int> mismatches(3, 0);
    std::vector<std::thread> callers;
    for (int t = 0; t < 3; ++t)
      callers.emplace_back([&, t] {
        omp_set_num_threads(2);
        for (int rep = 0; rep < 5; ++rep) mismatches[static_cast<std::size_t>(t)] += same_bits(run(), one) ? 0 : 1;
      });
    for (auto& t : callers) t.join();
    for (int m : mismatches) CHECK(m == 0);
  }
  omp_set_num_threads(saved_omp);
}

TEST_CASE("gemm: batched entries sharing C (stride 0) accumulate in order") {
  const int saved_omp = omp_get_max_threads();
  omp_set_num_threads(3);
  std::mt19937 rng(7);
  gemm_shape s;
  s.m = 13, s.n = 7, s.k = 5, s.beta = 1.0f;
  const gemm_batch batch{6, s.m * s.k, s.k * s.n, 0};
  const auto a = uniform(batch.count * s.m * s.k, rng), b = uniform(batch.count * s.k * s.n, rng);
  const auto c0 = uniform(s.m * s.n, rng);
  auto c = c0, expected = c0;
  dsa::cpu::gemm_ref(expected.data(), a.data(), b.data(), s, batch);
  dsa::cpu::gemm_batched(c.data(), a.data(), b.data(), s, batch);
  DSA_CHECK_CLOSE(c.data(), expected.data(), s.m * s.n, dsa::test::f32_gemm);
  omp_set_num_threads(saved_omp);
}
