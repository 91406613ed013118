// cuda::gemm_engine (cuBLASLt) against a double-precision product of the values as stored:
// every transpose, f32/f16/bf16 operands into f32 or half outputs, padded leading
// dimensions, strided batches, beta 0 over NaN and beta 1, the bias epilogue, and operands
// off the 256-byte alignment cuBLASLt assumes by default.
#include "gpu_test_util.hpp"

#include "kernels/cuda/gemm.hpp"

#include <cmath>
#include <limits>
#include <random>
#include <string>

namespace dsa::test {
namespace {

struct gemm_case {
  std::int64_t m = 37, n = 53, k = 71;
  bool ta = false, tb = false;
  cuda::elem ab = cuda::elem::f32, c = cuda::elem::f32;
  std::int64_t pad = 0;   // added to every leading dimension
  std::int64_t count = 1; // batch entries
  float alpha = 0.75f, beta = 0.0f;
  bool bias = false;
  cuda::elem bias_type = cuda::elem::f32;
  std::int64_t offset = 0; // elements each operand starts past its buffer's start
};

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v)
    x = dist(gen);
  return v;
}

// Runs one call and compares every output element (and that padding was left alone).
void check(cuda::gemm_engine& engine, const gemm_case& g) {
  INFO("m=" << g.m << " n=" << g.n << " k=" << g.k << " ta=" << g.ta << " tb=" << g.tb
            << " ab=" << std::string(elem_name(g.ab)) << " c=" << std::string(elem_name(g.c)) << " pad=" << g.pad
            << " count=" << g.count << " beta=" << g.beta << " bias=" << g.bias
            << " offset=" << g.offset);
  const std::int64_t rows_a = g.ta ? g.k : g.m, cols_a = g.ta ? g.m : g.k;
  const std::int64_t rows_b = g.tb ? g.n : g.k, cols_b = g.tb ? g.k : g.n;
  const std::int64_t lda = cols_a + g.pad, ldb = cols_b + g.pad, ldc = g.n + g.pad;
  const std::int64_t stride_a = rows_a * lda + 5, stride_b = rows_b * ldb + 3,
                     stride_c = g.m * ldc + 7;
  const auto size = [&](std::int64_t stride) {
    return static_cast<std::size_t>(g.offset + g.count * stride);
  };
  const std::vector<float> a = round_to(random_values(size(stride_a), 1), g.ab);
  const std::vector<float> b = round_to(random_values(size(stride_b), 2), g.ab);
  std::vector<float> c0 = round_to(random_values(size(stride_c), 3), g.c);
  if (g.beta == 0.0f) // C must not be read: NaN shows if it is
    for (auto& x : c0)
      x = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> bias = round_to(random_values(static_cast<std::size_t>(g.n), 4),
                                           g.bias_type);

  device_buffer da(a.size() * 4), db(b.size() * 4), dc(c0.size() * 4), dbias(bias.size() * 4);
  upload(da, encode(a, g.ab));
  upload(db, encode(b, g.ab));
  upload(dc, encode(c0, g.c));
  upload(dbias, encode(bias, g.bias_type));
  const auto es_ab = static_cast<std::size_t>(cuda::elem_size(g.ab)),
             es_c = static_cast<std::size_t>(cuda::elem_size(g.c));
  const auto at = [&](const device_buffer& buf, std::size_t es) {
    return static_cast<void*>(buf.as<char>() + static_cast<std::size_t>(g.offset) * es);
  };

  cuda::gemm_call call;
  call.a = at(da, es_ab);
  call.b = at(db, es_ab);
  call.c = at(dc, es_c);
  call.ab_type = g.ab;
  call.c_type = g.c;
  call.shape.m = g.m;
  call.shape.n = g.n;
  call.shape.k = g.k;
  call.shape.trans_a = g.ta ? cpu::transpose::yes : cpu::transpose::no;
  call.shape.trans_b = g.tb ? cpu::transpose::yes : cpu::transpose::no;
  call.shape.lda = lda;
  call.shape.ldb = ldb;
  call.shape.ldc = ldc;
  call.shape.alpha = g.alpha;
  call.shape.beta = g.beta;
  call.batch = {g.count, stride_a, stride_b, stride_c};
  if (g.bias) {
    call.epilogue = cuda::gemm_epilogue::bias;
    call.bias = dbias.as<void>();
    call.bias_type = g.bias_type;
  }
  test_stream stream;
  const status ran = engine.run(call, stream.get());
  INFO((ran ? std::string("ok") : ran.err().to_string()));
  REQUIRE(ran);
  stream.sync();
  const std::vector<float> got = download(dc, c0.size(), g.c);

  const double out_rel = g.c == cuda::elem::f32   ? 0.0
                         : g.c == cuda::elem::f16 ? test::gpu_f16_storage.rel
                                                  : test::gpu_bf16_storage.rel;
  int bad = 0;
  for (std::int64_t e = 0; e < g.count; ++e) {
    const float* ae = a.data() + g.offset + e * stride_a;
    const float* be = b.data() + g.offset + e * stride_b;
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j) {
        double sum = 0.0, mag = 0.0;
        for (std::int64_t p = 0; p < g.k; ++p) {
          const double x = g.ta ? ae[p * lda + i] : ae[i * lda + p];
          const double y = g.tb ? be[j * ldb + p] : be[p * ldb + j];
          sum += x * y;
          mag += std::fabs(x * y);
        }
        const std::size_t ci = static_cast<std::size_t>(g.offset + e * stride_c + i * ldc + j);
        double ref = g.alpha * sum;
        mag = std::fabs(g.alpha) * mag;
        if (g.beta != 0.0f) {
          ref += g.beta * static_cast<double>(c0[ci]);
          mag += std::fabs(g.beta * static_cast<double>(c0[ci]));
        }
        if (g.bias) {
          ref += bias[static_cast<std::size_t>(j)];
          mag += std::fabs(bias[static_cast<std::size_t>(j)]);
        }
        // A half output with the bias epilogue: cuBLASLt rounds the product to the output type
        // before adding the bias (seen on an H200: about 5 ulps of the result where the two
        // cancel), so one more rounding at the product's magnitude is allowed.
        const double pre_bias = g.bias && g.c != cuda::elem::f32 ? std::fabs(ref - bias[static_cast<std::size_t>(j)]) : 0.0;
        const double err = std::fabs(got[ci] - ref);
        if (!(err <= test::gpu_gemm.rel * mag + out_rel * (std::fabs(ref) + pre_bias) + test::gpu_gemm.abs) && ++bad <= 5)
          CHECK_MESSAGE(false, "C[" << e << "][" << i << "][" << j << "] = " << got[ci]
                                    << ", expected " << ref);
      }
  }
  CHECK(bad == 0);
  // Padding and the gaps between entries keep their old contents.
  std::vector<bool> written(c0.size(), false);
  for (std::int64_t e = 0; e < g.count; ++e)
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j)
        written[static_cast<std::size_t>(g.offset + e * stride_c + i * ldc + j)] = true;
  int touched = 0;
  for (std::size_t i = 0; i < c0.size(); ++i)
    if (!written[i] && !(std::isnan(c0[i]) ? std::isnan(got[i]) : got[i] == c0[i]))
      ++touched;
  CHECK(touched == 0);
}

std::unique_ptr<cuda::gemm_engine> open_engine() {
  auto engine = cuda::gemm_engine::open();
  INFO((engine ? std::string("ok") : engine.err().to_string()));
  REQUIRE(engine);
  return std::move(engine.value());
}

} // namespace

TEST_CASE("cuda gemm equals a double product for every transpose and operand type") {
  auto engine = open_engine();
  const std::pair<cuda::elem, cuda::elem> types[] = {
      {cuda::elem::f32, cuda::elem::f32},  {cuda::elem::f16, cuda::elem::f32},
      {cuda::elem::bf16, cuda::elem::f32}, {cuda::elem::f16, cuda::elem::f16},
      {cuda::elem::bf16, cuda::elem::bf16}};
  for (const auto& [ab, c] : types)
    for (int t = 0; t < 4; ++t) {
      gemm_case g;
      g.ab = ab;
      g.c = c;
      g.ta = (t & 1) != 0;
      g.tb = (t & 2) != 0;
      check(*engine, g);
      g.pad = 3;
      g.beta = 1.0f;
      check(*engine, g);
    }
}

TEST_CASE("cuda gemm: strided batches, the bias epilogue and unaligned operands") {
  auto engine = open_engine();
  for (const cuda::elem ab : {cuda::elem::f32, cuda::elem::bf16}) {
    gemm_case g;
    g.ab = ab;
    g.count = 3;
    g.tb = true;
    g.pad = 2;
    check(*engine, g);
    g.count = 1;
    g.bias = true;
    check(*engine, g); // f32 bias into an f32 output
    g.c = ab;
    g.bias_type = ab;
    check(*engine, g); // a bias of the output's type
    g.bias = false;
    g.offset = 3; // 12 or 6 bytes past an aligned start
    check(*engine, g);
    g.m = 1;
    g.n = 1;
    g.k = 1;
    check(*engine, g);
  }
  // One engine keeps a plan per distinct call and reuses it.
  const std::size_t plans = engine->plan_count();
  gemm_case g;
  check(*engine, g);
  check(*engine, g);
  CHECK(engine->plan_count() <= plans + 1);
}

TEST_CASE("cuda gemm: k = 0 clears or keeps C, and bad calls are refused without launching") {
  auto engine = open_engine();
  test_stream stream;
  device_buffer a(64), b(64), c(4 * 6);
  const std::vector<float> ones(6, 1.0f);
  upload(c, ones);
  cuda::gemm_call call;
  call.a = a.as<void>();
  call.b = b.as<void>();
  call.c = c.as<void>();
  call.shape.m = 2;
  call.shape.n = 3;
  call.shape.k = 0;
  call.shape.beta = 1.0f;
  REQUIRE(engine->run(call, stream.get()));
  stream.sync();
  CHECK(download(c, 6, cuda::elem::f32) == ones);
  call.shape.beta = 0.0f;
  REQUIRE(engine->run(call, stream.get()));
  stream.sync();
  CHECK(download(c, 6, cuda::elem::f32) == std::vector<float>(6, 0.0f));

  call.shape.k = 4;
  cuda::gemm_call bad = call;
  bad.shape.lda = 2; // below k
  CHECK(engine->run(bad, stream.get()).err().code == errc::invalid_argument);
  bad = call;
  bad.c_type = cuda::elem::bf16; // a half output of f32 operands
  CHECK(engine->run(bad, stream.get()).err().code == errc::invalid_argument);
  bad = call;
  bad.epilogue = cuda::gemm_epilogue::bias; // no bias pointer
  CHECK(engine->run(bad, stream.get()).err().code == errc::invalid_argument);
  bad = call;
  bad.ab_type = bad.c_type = cuda::elem::bf16;
  bad.epilogue = cuda::gemm_epilogue::bias;
  bad.bias = c.as<void>();
  bad.bias_type = cuda::elem::f32; // cuBLASLt has none for an f32 bias into a half output
  CHECK(engine->run(bad, stream.get()).err().code == errc::invalid_argument);
  bad = call;
  bad.batch.count = 0;
  CHECK(engine->run(bad, stream.get()).err().code == errc::invalid_argument);
  bad = call;
  bad.a = nullptr;
  CHECK(engine->run(bad, stream.get()).err().code == errc::invalid_argument);
  CHECK(engine->plan_count() == 0);
}

} // namespace dsa::test
