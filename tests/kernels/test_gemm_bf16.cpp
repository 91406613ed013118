// kernels/cpu/gemm_bf16: oneDNN's bf16 matmul against the double-accumulating reference on
// the widened bf16 operands, over every transpose, padded leading dimensions (NaN padding,
// so a stray read shows), alpha and beta, batches with gaps, a broadcast operand and entries
// sharing C; and the bf16 operands mode that routes cpu::gemm through it. On a CPU without
// AVX512_BF16/AMX, or a build without oneDNN, the cases say so and check that the mode
// reports itself unsupported.
#include "core/half.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/gemm_bf16.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/run_notes.hpp"

#include <doctest/doctest.h>

#include <algorithm>
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

bool supported() {
  std::string why;
  if (dsa::cpu::bf16_gemm_supported(&why)) return true;
  CHECK(!why.empty());
  dsa::test::skip_for_cpu("AVX512_BF16 or AMX", why);
  CHECK(dsa::cpu::bf16_gemm_implementation().empty());
  return false;
}

// `count` stored matrices `stride` apart, each (rows, cols) with row stride ld: values are
// bf16-representable (so the f32 reference sees exactly what the bf16 GEMM multiplies),
// the padding and gaps NaN.
std::vector<float> batch_of(std::int64_t count, std::int64_t stride, std::int64_t rows, std::int64_t cols,
                            std::int64_t ld, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const std::int64_t one = (rows - 1) * ld + cols;
  std::vector<float> v(static_cast<std::size_t>((count - 1) * stride + one), NAN);
  for (std::int64_t e = 0; e < count; ++e)
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c)
        v[static_cast<std::size_t>(e * stride + r * ld + c)] = dsa::bf16_to_f32(dsa::f32_to_bf16(dist(rng)));
  return v;
}

std::vector<std::uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<std::uint16_t> out(v.size());
  dsa::cpu::cast(out.data(), dsa::dtype::bf16, v.data(), dsa::dtype::f32, static_cast<std::int64_t>(v.size()));
  return out;
}

struct problem {
  gemm_shape s;
  gemm_batch batch;
  std::vector<float> a, b, c;
};

problem make(gemm_shape s, std::int64_t pad, gemm_batch batch, std::mt19937& rng) {
  const bool ta = s.trans_a == transpose::yes, tb = s.trans_b == transpose::yes;
  const std::int64_t rows_a = ta ? s.k : s.m, cols_a = ta ? s.m : s.k;
  const std::int64_t rows_b = tb ? s.n : s.k, cols_b = tb ? s.k : s.n;
  s.lda = cols_a + pad;
  s.ldb = cols_b + pad;
  s.ldc = s.n + pad;
  problem p{s, batch, {}, {}, {}};
  p.a = batch_of(batch.count, batch.stride_a, rows_a, cols_a, s.lda, rng);
  p.b = batch_of(batch.count, batch.stride_b, rows_b, cols_b, s.ldb, rng);
  p.c = batch_of(batch.count, batch.stride_c, s.m, s.n, s.ldc, rng);
  if (s.beta == 0.0f)
    for (std::int64_t e = 0; e < batch.count; ++e)
      for (std::int64_t r = 0; r < s.m; ++r)
        for (std::int64_t c = 0; c < s.n; ++c) p.c[static_cast<std::size_t>(e * batch.stride_c + r * s.ldc + c)] = NAN;
  return p;
}

std::string describe(const problem& p) {
  const auto& s = p.s;
  return fmt::format("m={} n={} k={} ta={} tb={} ld={}/{}/{} alpha={} beta={} batch={} strides={}/{}/{}", s.m, s.n,
                     s.k, s.trans_a == transpose::yes, s.trans_b == transpose::yes, s.lda, s.ldb, s.ldc, s.alpha,
                     s.beta, p.batch.count, p.batch.stride_a, p.batch.stride_b, p.batch.stride_c);
}

// With primitives for fixed shapes and with shapes at run time (the two ways gemm_bf16 keys
// them), each against the reference.
void check_against_reference(const problem& p) {
  const bool chosen = dsa::cpu::bf16_gemm_runtime_shapes();
  for (bool runtime : {false, true}) {
    INFO(describe(p) << (runtime ? " shapes at run time" : " fixed shapes"));
    dsa::cpu::set_bf16_gemm_runtime_shapes(runtime);
    std::vector<float> want = p.c, got = p.c;
    dsa::cpu::gemm_ref(want.data(), p.a.data(), p.b.data(), p.s, p.batch);
    const auto a16 = to_bf16(p.a), b16 = to_bf16(p.b);
    dsa::cpu::gemm_bf16(got.data(), a16.data(), b16.data(), p.s, p.batch);
    // The whole buffer: C's padding and gaps stay NaN on both sides.
    DSA_CHECK_CLOSE(got.data(), want.data(), static_cast<std::int64_t>(got.size()), dsa::test::f32_gemm);
  }
  dsa::cpu::set_bf16_gemm_runtime_shapes(chosen);
}

} // namespace

TEST_CASE("gemm_bf16: every transpose, padded leading dimensions, alpha and beta against the reference") {
  if (!supported()) return;
  std::mt19937 rng(11);
  struct mnk {
    std::int64_t m, n, k;
  };
  for (const mnk& size : {mnk{1, 1, 1}, mnk{37, 131, 13}, mnk{128, 64, 256}, mnk{13, 29, 100}, mnk{256, 1024, 256}})
    for (transpose ta : {transpose::no, transpose::yes})
      for (transpose tb : {transpose::no, transpose::yes})
        for (std::int64_t pad : {0, 3})
          for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{1.0f, 1.0f}, std::pair{-0.75f, 0.5f}}) {
            gemm_shape s;
            s.m = size.m, s.n = size.n, s.k = size.k, s.trans_a = ta, s.trans_b = tb, s.alpha = alpha, s.beta = beta;
            check_against_reference(make(s, pad, {}, rng));
          }
}

TEST_CASE("gemm_bf16: batches with gaps, a broadcast operand, entries sharing C, and k = 0") {
  if (!supported()) return;
  std::mt19937 rng(12);
  for (transpose ta : {transpose::no, transpose::yes})
    for (transpose tb : {transpose::no, transpose::yes}) {
      gemm_shape s;
      s.m = 13, s.n = 37, s.k = 9, s.trans_a = ta, s.trans_b = tb, s.beta = 1.0f;
      s.lda = (ta == transpose::yes ? s.m : s.k) + 2;
      s.ldb = (tb == transpose::yes ? s.k : s.n) + 2;
      s.ldc = s.n + 2;
      const std::int64_t ext_a = dsa::cpu::gemm_operand_extent(s, true), ext_b = dsa::cpu::gemm_operand_extent(s, false);
      const std::int64_t ext_c = (s.m - 1) * s.ldc + s.n;
      check_against_reference(make(s, 2, {3, ext_a + 5, ext_b + 1, ext_c + 11}, rng)); // gaps
      check_against_reference(make(s, 2, {3, ext_a, 0, ext_c}, rng));                  // B broadcast
      check_against_reference(make(s, 2, {3, ext_a, ext_b, 0}, rng));                  // C shared: in order
    }
  // Attention's heads: column blocks of the same rows.
  gemm_shape heads;
  heads.m = 16, heads.n = 8, heads.k = 8, heads.ldc = 32, heads.lda = 32, heads.ldb = 32;
  problem p{heads, {4, 8, 8, 8}, {}, {}, {}};
  p.a = batch_of(1, 0, 16, 32, 32, rng);
  p.b = batch_of(1, 0, 8, 32, 32, rng);
  p.c = batch_of(1, 0, 16, 32, 32, rng);
  for (float& x : p.c) x = NAN;
  check_against_reference(p);
  // k = 0: only beta C remains.
  gemm_shape empty;
  empty.m = 3, empty.n = 4, empty.k = 0, empty.beta = 0.5f, empty.lda = 1, empty.ldb = 4;
  std::vector<float> c(12, 2.0f);
  const std::uint16_t unused = 0;
  dsa::cpu::gemm_bf16(c.data(), &unused, &unused, empty);
  for (float x : c) CHECK(x == 1.0f);
}

TEST_CASE("bf16 operands mode: cpu::gemm and gemm_batched round to bf16 and run gemm_bf16, within its scope") {
  if (!supported()) {
    CHECK(!dsa::cpu::bf16_operands());
    return;
  }
  // One of oneDNN's optimized implementations, not its reference loops.
  const std::string impl = dsa::cpu::bf16_gemm_implementation();
  INFO(impl);
  CHECK((impl.rfind("brg", 0) == 0 || impl.rfind("gemm:jit", 0) == 0));
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  gemm_shape s;
  s.m = 64, s.n = 48, s.k = 200, s.trans_b = transpose::yes;
  std::vector<float> a(64 * 200), b(48 * 200);
  for (float& x : a) x = dist(rng); // not bf16-representable: the mode must round them
  for (float& x : b) x = dist(rng);
  std::vector<float> f32(64 * 48), rounded(64 * 48), mode(64 * 48), batched(64 * 48);
  dsa::cpu::gemm(f32.data(), a.data(), b.data(), s);
  const auto a16 = to_bf16(a), b16 = to_bf16(b);
  dsa::cpu::gemm_bf16(rounded.data(), a16.data(), b16.data(), s);
  {
    dsa::cpu::bf16_operands_scope on(true);
    CHECK(dsa::cpu::bf16_operands());
    dsa::cpu::gemm(mode.data(), a.data(), b.data(), s);
    dsa::cpu::gemm_batched(batched.data(), a.data(), b.data(), s, {1, 0, 0, 0});
  }
  CHECK(!dsa::cpu::bf16_operands());
  CHECK(std::memcmp(mode.data(), rounded.data(), mode.size() * 4) == 0);
  CHECK(std::memcmp(batched.data(), rounded.data(), mode.size() * 4) == 0);
  // And it is a bf16 product: it differs from the f32 one by about bf16's rounding.
  double worst = 0;
  for (std::size_t i = 0; i < f32.size(); ++i) worst = std::max(worst, double(std::fabs(mode[i] - f32[i])));
  CHECK(worst > 1e-4);
  CHECK(worst < 0.2);
}

TEST_CASE("bf16 operands mode: stored bf16 operands are used as they are, f32 and f16 ones rounded, batches included") {
  if (!supported()) return;
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  gemm_shape s;
  s.m = 40, s.n = 24, s.k = 72, s.trans_a = transpose::yes, s.lda = 44, s.beta = 1.0f;
  const gemm_batch batch{3, 72 * 44, 0, 40 * 24};
  std::vector<float> a(static_cast<std::size_t>(3 * 72 * 44)), b(72 * 24), c0(3 * 40 * 24);
  for (float& x : a) x = dist(rng);
  for (float& x : b) x = dist(rng);
  for (float& x : c0) x = dist(rng);
  const auto a16 = to_bf16(a), b16 = to_bf16(b);
  std::vector<std::uint16_t> b_f16(b.size());
  dsa::cpu::cast(b_f16.data(), dsa::dtype::f16, b.data(), dsa::dtype::f32, static_cast<std::int64_t>(b.size()));
  std::vector<float> b_f16_wide(b.size());
  dsa::cpu::cast(b_f16_wide.data(), dsa::dtype::f32, b_f16.data(), dsa::dtype::f16, static_cast<std::int64_t>(b.size()));
  dsa::cpu::bf16_operands_scope on(true);
  using dsa::cpu::gemm_operand;
  // From f32: the rounding the mode does; from bf16: no rounding left to do.
  std::vector<float> want = c0, stored = c0, mixed = c0, from_f16 = c0, want_f16 = c0;
  dsa::cpu::gemm_batched(want.data(), a.data(), b.data(), s, batch);
  dsa::cpu::gemm_batched(stored.data(), gemm_operand{a16.data(), dsa::dtype::bf16},
                         gemm_operand{b16.data(), dsa::dtype::bf16}, s, batch);
  dsa::cpu::gemm_batched(mixed.data(), gemm_operand{a.data()}, gemm_operand{b16.data(), dsa::dtype::bf16}, s, batch);
  CHECK(std::memcmp(stored.data(), want.data(), want.size() * 4) == 0);
  CHECK(std::memcmp(mixed.data(), want.data(), want.size() * 4) == 0);
  // An f16 operand is rounded to bf16 from its exact value.
  dsa::cpu::gemm_batched(from_f16.data(), gemm_operand{a16.data(), dsa::dtype::bf16},
                         gemm_operand{b_f16.data(), dsa::dtype::f16}, s, batch);
  dsa::cpu::gemm_batched(want_f16.data(), a.data(), b_f16_wide.data(), s, batch);
  CHECK(std::memcmp(from_f16.data(), want_f16.data(), want.size() * 4) == 0);
}

namespace {

// An (m, n) product over k = 8 through gemm_bf16 and through the f32 reference.
struct rows_product {
  std::vector<float> got, want;
  std::string described;
};

rows_product product_of_rows(std::int64_t m, std::int64_t n, std::mt19937& rng) {
  gemm_shape t;
  t.m = m, t.n = n, t.k = 8;
  problem p = make(t, 0, {}, rng);
  rows_product r{p.c, p.c, describe(p)};
  dsa::cpu::gemm_ref(r.want.data(), p.a.data(), p.b.data(), p.s, p.batch);
  const auto a16 = to_bf16(p.a), b16 = to_bf16(p.b);
  dsa::cpu::gemm_bf16(r.got.data(), a16.data(), b16.data(), p.s, p.batch);
  return r;
}

} // namespace

TEST_CASE("gemm_bf16: a shape called again with other buffers, and after more shapes than a thread keeps bound") {
  if (!supported()) return;
  std::mt19937 rng(29);
  gemm_shape s;
  s.m = 33, s.n = 17, s.k = 40;
  // Same shape, three sets of buffers alive at once and used in turn, so that each call
  // must read and write its own (a bound call holding the first pointers would fail).
  std::vector<problem> live;
  for (int i = 0; i < 3; ++i) live.push_back(make(s, 0, {}, rng));
  std::vector<std::vector<std::uint16_t>> a16, b16;
  std::vector<std::vector<float>> got;
  for (const problem& p : live) {
    a16.push_back(to_bf16(p.a));
    b16.push_back(to_bf16(p.b));
    got.push_back(p.c);
  }
  for (int round = 0; round < 2; ++round)
    for (std::size_t i = 0; i < live.size(); ++i) {
      got[i] = live[i].c;
      dsa::cpu::gemm_bf16(got[i].data(), a16[i].data(), b16[i].data(), s, {});
      std::vector<float> want = live[i].c;
      dsa::cpu::gemm_ref(want.data(), live[i].a.data(), live[i].b.data(), s, {});
      INFO("set " << i << " round " << round);
      DSA_CHECK_CLOSE(got[i].data(), want.data(), static_cast<std::int64_t>(want.size()), dsa::test::f32_gemm);
    }
  // 300 distinct row counts (past the 256 bound calls a thread keeps), then the first again.
  for (std::int64_t m = 1; m <= 300; ++m) {
    const rows_product r = product_of_rows(m, 8, rng);
    INFO(r.described);
    DSA_CHECK_CLOSE(r.got.data(), r.want.data(), static_cast<std::int64_t>(r.got.size()), dsa::test::f32_gemm);
  }
  check_against_reference(make(s, 0, {}, rng));
  const dsa::cpu::bf16_gemm_kept kept = dsa::cpu::bf16_gemm_kept_by_this_thread();
  CHECK(kept.bound == 256);
  CHECK(kept.calls >= 1);
  CHECK(kept.calls <= kept.bound);
  CHECK(kept.primitives <= kept.bound);
}

TEST_CASE("gemm_bf16: with fixed shapes a thread keeps at most the bound of primitives") {
  if (!supported()) return;
  const bool was = dsa::cpu::bf16_gemm_runtime_shapes();
  dsa::cpu::set_bf16_gemm_runtime_shapes(false);
  std::mt19937 rng(31);
  // Each row count is its own fixed-shape primitive: 300 of them run on a fresh thread (the
  // counts are per thread), past the 256 it keeps; every product still matches.
  std::size_t most = 0, last = 0;
  bool all_close = true;
  std::thread worker([&] {
    for (std::int64_t m = 1; m <= 300; ++m) {
      const rows_product r = product_of_rows(m, 4, rng);
      for (std::size_t i = 0; i < r.got.size(); ++i)
        all_close = all_close && std::fabs(r.got[i] - r.want[i]) <= 1e-3f * (1.0f + std::fabs(r.want[i]));
      last = dsa::cpu::bf16_gemm_kept_by_this_thread().primitives;
      most = std::max(most, last);
    }
  });
  worker.join();
  dsa::cpu::set_bf16_gemm_runtime_shapes(was);
  CHECK(all_close);
  CHECK(most == 256); // it reached the bound and went no further
  CHECK(last == 300 - 256); // started over once, then kept the rest
}

TEST_CASE("gemm_batched_groups: attention's sequences of heads in one call, against the reference; refusals write nothing") {
  if (!supported()) return;
  std::mt19937 rng(41);
  const std::int64_t B = 3, A = 4, T = 16, d = 8, H = A * d;
  const bool chosen = dsa::cpu::bf16_gemm_runtime_shapes();
  dsa::cpu::set_bf16_gemm_runtime_shapes(true);
  dsa::cpu::bf16_operands_scope on(true);
  using dsa::cpu::gemm_groups;
  using dsa::cpu::gemm_operand;
  // Each sequence's reference: gemm_ref over its heads.
  auto reference = [&](std::vector<float> c, const std::vector<float>& a, const std::vector<float>& b, gemm_shape s,
                       gemm_batch batch, gemm_groups g) {
    for (std::int64_t q = 0; q < g.count; ++q)
      dsa::cpu::gemm_ref(c.data() + q * g.stride_c, a.data() + q * g.stride_a, b.data() + q * g.stride_b, s, batch);
    return c;
  };
  // Scores: Q K^T per head, heads as column blocks of each sequence's (T, H) rows.
  const auto q = batch_of(1, 0, B * T, H, H, rng), k = batch_of(1, 0, B * T, H, H, rng);
  gemm_shape scores;
  scores.m = T, scores.n = T, scores.k = d, scores.trans_b = transpose::yes, scores.lda = H, scores.ldb = H;
  scores.ldc = T;
  const gemm_batch heads{A, d, d, T * T};
  const gemm_groups sequences{B, T * H, T * H, A * T * T};
  std::vector<float> got(static_cast<std::size_t>(B * A * T * T), NAN);
  const auto q16 = to_bf16(q), k16 = to_bf16(k);
  CHECK(dsa::cpu::gemm_batched_groups(got.data(), gemm_operand{q16.data(), dsa::dtype::bf16},
                                      gemm_operand{k16.data(), dsa::dtype::bf16}, scores, heads, sequences));
  auto want = reference(std::vector<float>(got.size(), NAN), q, k, scores, heads, sequences);
  DSA_CHECK_CLOSE(got.data(), want.data(), static_cast<std::int64_t>(got.size()), dsa::test::f32_gemm);
  // Context and dV: P (or P^T) times V into the heads' column blocks, f32 operands rounded,
  // beta 0.5 (C read once per element).
  const auto p = batch_of(B * A, T * T, T, T, T, rng), v = batch_of(1, 0, B * T, H, H, rng);
  for (transpose tp : {transpose::no, transpose::yes}) {
    gemm_shape context;
    context.m = T, context.n = d, context.k = T, context.trans_a = tp, context.lda = T, context.ldb = H;
    context.ldc = H, context.beta = 0.5f;
    const gemm_batch ctx_heads{A, T * T, d, d};
    const gemm_groups ctx_sequences{B, A * T * T, T * H, T * H};
    std::vector<float> c0 = batch_of(1, 0, B * T, H, H, rng), c = c0;
    INFO("P transposed: " << (tp == transpose::yes));
    CHECK(dsa::cpu::gemm_batched_groups(c.data(), gemm_operand{p.data()}, gemm_operand{v.data()}, context, ctx_heads,
                                        ctx_sequences));
    const auto ctx_want = reference(c0, p, v, context, ctx_heads, ctx_sequences);
    DSA_CHECK_CLOSE(c.data(), ctx_want.data(), static_cast<std::int64_t>(c.size()), dsa::test::f32_gemm);
  }
  // Refused, nothing written: groups writing the same C, B shared by the groups, fixed
  // shapes, and the mode off. The caller then runs the groups itself.
  std::vector<float> untouched(got.size(), 7.0f);
  auto refused = [&](gemm_groups g) {
    return !dsa::cpu::gemm_batched_groups(untouched.data(), gemm_operand{q16.data(), dsa::dtype::bf16},
                                          gemm_operand{k16.data(), dsa::dtype::bf16}, scores, heads, g);
  };
  CHECK(refused({B, T * H, T * H, 0}));
  CHECK(refused({B, T * H, T * H, A * T * T - 1})); // the groups' C overlap by one element
  CHECK(refused({B, T * H, 0, A * T * T}));
  dsa::cpu::set_bf16_gemm_runtime_shapes(false);
  CHECK(refused(sequences));
  dsa::cpu::set_bf16_gemm_runtime_shapes(true);
  {
    dsa::cpu::bf16_operands_scope off(false);
    CHECK(refused(sequences));
  }
  CHECK(std::all_of(untouched.begin(), untouched.end(), [](float x) { return x == 7.0f; }));
  dsa::cpu::set_bf16_gemm_runtime_shapes(chosen);
}
