// The embedding kernels (kernels/cuda/embedding.hpp) against the CPU composition of
// models/bert/embeddings.cpp on the widened stored tables: cpu::embedding_forward, the
// position and token-type adds, cpu::layernorm_forward and cpu::dropout_forward; and, from
// the values the GPU forward stored, dropout's gradient (cpu::dropout_forward on dout),
// cpu::layernorm_backward and the scatter and column sums in double. Also: pad and unused
// rows untouched, null optional pointers, refusals without a launch.
#include "kernels/cpu/dropout.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/layernorm.hpp"
#include "kernels/cuda/embedding.hpp"

#include "tests/gpu/gpu_test_util.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/random.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

using namespace dsa;
using test::device_buffer;
using test::random_vector;

namespace {

constexpr cuda::elem all_types[] = {cuda::elem::f32, cuda::elem::f16, cuda::elem::bf16};
constexpr std::int64_t batch = 3, seq = 7, rows = batch * seq;
// More positions than seq: the rows past it must stay untouched.
constexpr std::int64_t vocab = 50, positions = 9, types = 2;
constexpr std::int32_t pad_id = 0;
// A prime below a block's 256 threads; BERT-large; the widest rows whose backward keeps
// column sums in shared memory (3 hidden floats and block_sum's scratch in 48 KiB); and
// past them, where the backward takes a row per block and atomics.
constexpr std::int64_t hiddens[] = {37, 1024, 4093, 4099};
constexpr float rates[] = {0.1f, 0.0f};
constexpr float eps = 1e-12f;

// Three sequences with repeated ids (2, 5, 17, 33, 49) and trailing pads.
constexpr std::int32_t input_ids[rows] = {2, 17, 5,  17, 49, 0,  0, //
                                          2, 33, 33, 8,  1,  49, 0, //
                                          2, 5,  11, 42, 17, 3,  49};
// Segments A then B, pads of type 0: the type changes inside the backward's row blocks.
constexpr std::int32_t segment_ids[rows] = {0, 0, 0, 1, 1, 0, 0, //
                                            0, 0, 1, 1, 1, 1, 0, //
                                            0, 0, 0, 0, 1, 1, 1};

// Whether the call gets token type ids (absent: every row has type 0, token_types null).
enum class segments { given, absent };
constexpr segments all_segments[] = {segments::given, segments::absent};

struct embedding_case {
  cuda::elem type;
  std::int64_t hidden;
  float p;
  segments seg;
};

// Runs fn(case) for every storage type, width, rate and token-type choice, naming them.
template <class Fn> void for_each_case(Fn fn) {
  for (auto type : all_types)
    for (auto hidden : hiddens)
      for (float p : rates)
        for (auto seg : all_segments) {
          INFO(std::string(test::elem_name(type))
               << " rows=" << rows << " hidden=" << hidden << " p=" << p
               << " token_types=" << (seg == segments::given ? "given" : "null"));
          fn(embedding_case{type, hidden, p, seg});
        }
}

// The stream models/bert/embeddings.cpp draws from: layer 0, site::embeddings (0).
philox_stream test_rng() {
  philox_stream rng;
  rng.seed = 0x0123456789abcdefull;
  rng.step = 5;
  rng.micro_batch = 2;
  rng.layer = 0;
  rng.site = 0;
  return rng;
}

std::size_t bytes_of(std::int64_t n, cuda::elem type) {
  return static_cast<std::size_t>(n * cuda::elem_size(type));
}
// n four-byte values (f32 or int32).
std::size_t word_bytes(std::int64_t n) {
  return static_cast<std::size_t>(n) * 4;
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

void upload_ints(device_buffer& dst, const std::vector<std::int32_t>& src) {
  REQUIRE(src.size() * 4 <= dst.bytes());
  DSA_REQUIRE_CUDA(cudaMemcpy(dst.as<void>(), src.data(), src.size() * 4, cudaMemcpyHostToDevice));
}

// The row's token type as the kernels read it.
std::int64_t type_of(segments seg, std::int64_t row) {
  return seg == segments::given ? segment_ids[row] : 0;
}

// One case's inputs: tables rounded to the storage type (the host copies are the widened
// stored values both sides read), gamma and beta in f32, on the host and the device.
struct inputs {
  explicit inputs(const embedding_case& k);
  const std::int32_t* device_types() const {
    return seg == segments::given ? d_types.as<std::int32_t>() : nullptr;
  }

  segments seg;
  std::vector<float> word, position, token_type, gamma, beta;
  device_buffer d_ids, d_types, d_word, d_position, d_token_type, d_gamma, d_beta;
};

inputs::inputs(const embedding_case& k)
    : seg(k.seg), word(test::round_to(random_vector(vocab * k.hidden, -1.0f, 1.0f, 11), k.type)),
      position(test::round_to(random_vector(positions * k.hidden, -0.5f, 0.5f, 12), k.type)),
      token_type(test::round_to(random_vector(types * k.hidden, -0.5f, 0.5f, 13), k.type)),
      gamma(random_vector(k.hidden, 0.5f, 1.5f, 14)),
      beta(random_vector(k.hidden, -0.5f, 0.5f, 15)), d_ids(word_bytes(rows)),
      d_types(word_bytes(rows)), d_word(bytes_of(vocab * k.hidden, k.type)),
      d_position(bytes_of(positions * k.hidden, k.type)),
      d_token_type(bytes_of(types * k.hidden, k.type)), d_gamma(word_bytes(k.hidden)),
      d_beta(word_bytes(k.hidden)) {
  upload_ints(d_ids, std::vector<std::int32_t>(input_ids, input_ids + rows));
  upload_ints(d_types, std::vector<std::int32_t>(segment_ids, segment_ids + rows));
  test::upload(d_word, test::encode(word, k.type));
  test::upload(d_position, test::encode(position, k.type));
  test::upload(d_token_type, test::encode(token_type, k.type));
  test::upload(d_gamma, gamma);
  test::upload(d_beta, beta);
}

// models/bert/embeddings.cpp's forward on the CPU: e in f32, LayerNorm, dropout (with its mask).
struct forward_reference {
  std::vector<float> e, out, mean, rstd;
  std::vector<std::uint8_t> mask;
};

forward_reference reference_forward(const inputs& in, const embedding_case& k,
                                    const philox_stream& rng) {
  const std::int64_t H = k.hidden, n = rows * H;
  const auto nn = static_cast<std::size_t>(n);
  forward_reference r;
  r.e.resize(nn);
  r.out.resize(nn);
  r.mask.resize(nn);
  r.mean.resize(static_cast<std::size_t>(rows));
  r.rstd.resize(static_cast<std::size_t>(rows));
  cpu::embedding_forward(r.e.data(), in.word.data(), input_ids, rows, vocab, H);
  for (std::int64_t row = 0; row < rows; ++row) {
    const float* prow = in.position.data() + (row % seq) * H;
    const float* trow = in.token_type.data() + type_of(k.seg, row) * H;
    float* erow = r.e.data() + row * H;
    for (std::int64_t j = 0; j < H; ++j)
      erow[j] += prow[j] + trow[j];
  }
  cpu::layernorm_forward(r.out.data(), r.mean.data(), r.rstd.data(), r.e.data(), in.gamma.data(),
                         in.beta.data(), eps, rows, H);
  cpu::dropout_forward(r.out.data(), r.mask.data(), r.out.data(), k.p, rng, n);
  return r;
}

// Whether the forward is given sum (skip: null).
enum class stash { keep, skip };
// The GPU forward's outputs, poisoned before the call.
struct forward_run {
  forward_run(const inputs& in, const embedding_case& k, const philox_stream& rng, stash s,
              const test::test_stream& stream);

  device_buffer d_out, d_sum, d_mean, d_rstd;
};

forward_run::forward_run(const inputs& in, const embedding_case& k, const philox_stream& rng,
                         stash s, const test::test_stream& stream)
    : d_out(bytes_of(rows * k.hidden, k.type)), d_sum(bytes_of(rows * k.hidden, k.type)),
      d_mean(word_bytes(rows)), d_rstd(word_bytes(rows)) {
  poison(d_out);
  poison(d_sum);
  poison(d_mean);
  poison(d_rstd);
  DSA_REQUIRE_CUDA(cuda::embedding_forward(
      d_out.as<void>(), s == stash::keep ? d_sum.as<void>() : nullptr, d_mean.as<float>(),
      d_rstd.as<float>(), in.d_ids.as<std::int32_t>(), in.device_types(), in.d_word.as<void>(),
      in.d_position.as<void>(), in.d_token_type.as<void>(), in.d_gamma.as<float>(),
      in.d_beta.as<float>(), eps, k.p, rng, k.type, rows, seq, k.hidden, stream.get()));
  stream.sync();
}

// Elements of `actual` that are not exactly `expected`; the first one's index in *first.
std::int64_t count_differences(const std::vector<float>& actual, const std::vector<float>& expected,
                               std::int64_t* first) {
  REQUIRE(actual.size() == expected.size());
  std::int64_t count = 0;
  *first = -1;
  for (std::size_t i = 0; i < actual.size(); ++i)
    if (std::memcmp(&actual[i], &expected[i], 4) != 0) {
      if (count++ == 0)
        *first = static_cast<std::int64_t>(i);
    }
  return count;
}

} // namespace

TEST_CASE("cuda embedding forward matches the CPU composition, mask included") {
  const test::test_stream stream;
  const philox_stream rng = test_rng();
  for_each_case([&](const embedding_case& k) {
    const inputs in(k);
    const forward_reference ref = reference_forward(in, k, rng);
    const forward_run f(in, k, rng, stash::keep, stream);
    const std::int64_t n = rows * k.hidden;
    const auto nn = static_cast<std::size_t>(n);
    const auto out = test::download(f.d_out, nn, k.type);
    const auto sum = test::download(f.d_sum, nn, k.type);
    const auto mean = test::download(f.d_mean, static_cast<std::size_t>(rows), cuda::elem::f32);
    const auto rstd = test::download(f.d_rstd, static_cast<std::size_t>(rows), cuda::elem::f32);

    // The same f32 additions in the same order, rounded once to the stash type: equal bits.
    std::int64_t first = -1;
    const std::int64_t sum_differences =
        count_differences(sum, test::round_to(ref.e, k.type), &first);
    INFO("sum differs at " << sum_differences << " elements, first " << first);
    CHECK(sum_differences == 0);
    DSA_CHECK_CLOSE(mean.data(), ref.mean.data(), rows, test::gpu_f32_reduction);
    DSA_CHECK_CLOSE(rstd.data(), ref.rstd.data(), rows, test::gpu_f32_reduction);
    const auto out_stored = test::round_to(ref.out, k.type);
    DSA_CHECK_CLOSE(out.data(), out_stored.data(), n,
                    test::storage_tolerance(k.type, test::gpu_f32_reduction));

    // The mask: every element the CPU drops is exactly zero on the GPU too.
    std::int64_t dropped = 0, dropped_nonzero = 0;
    for (std::size_t i = 0; i < nn; ++i)
      if (ref.mask[i] == 0) {
        ++dropped;
        if (out[i] != 0.0f || std::signbit(out[i]))
          ++dropped_nonzero;
      }
    CHECK(dropped_nonzero == 0);
    if (k.p > 0.0f)
      CHECK(dropped > 0); // n >= 777: about 78 drops expected at the smallest width
    else
      CHECK(dropped == 0);

    // Without the stash: the same out, mean and rstd, bit for bit.
    const forward_run no_sum(in, k, rng, stash::skip, stream);
    CHECK(test::download_bytes(no_sum.d_out, f.d_out.bytes()) ==
          test::download_bytes(f.d_out, f.d_out.bytes()));
    CHECK(test::download_bytes(no_sum.d_mean, f.d_mean.bytes()) ==
          test::download_bytes(f.d_mean, f.d_mean.bytes()));
    CHECK(test::download_bytes(no_sum.d_rstd, f.d_rstd.bytes()) ==
          test::download_bytes(f.d_rstd, f.d_rstd.bytes()));
    CHECK(all_poisoned(no_sum.d_sum));
  });
}

namespace {

// Gradients before the backward (nonzero: the kernel must add to them) and, for the
// reference, after it in double.
struct gradients {
  std::vector<float> dword, dposition, dtoken_type, dgamma, dbeta;
};

gradients preloaded_gradients(std::int64_t hidden) {
  return {random_vector(vocab * hidden, -1.0f, 1.0f, 31),
          random_vector(positions * hidden, -1.0f, 1.0f, 32),
          random_vector(types * hidden, -1.0f, 1.0f, 33), random_vector(hidden, -1.0f, 1.0f, 34),
          random_vector(hidden, -1.0f, 1.0f, 35)};
}

struct reference_gradients {
  std::vector<double> dword, dposition, dtoken_type, dgamma, dbeta;
};

// models/bert/embeddings.cpp's backward from the GPU forward's stored sum, mean and rstd:
// dropout's gradient and the LayerNorm input gradient in f32 (the CPU kernels), then the
// column and scatter sums onto the preloaded gradients in double.
reference_gradients reference_backward(const inputs& in, const embedding_case& k,
                                       const philox_stream& rng, const std::vector<float>& dout,
                                       const std::vector<float>& sum,
                                       const std::vector<float>& mean,
                                       const std::vector<float>& rstd, const gradients& g0) {
  const std::int64_t H = k.hidden, n = rows * H;
  std::vector<float> d = dout, de(static_cast<std::size_t>(n));
  cpu::dropout_forward(d.data(), nullptr, d.data(), k.p, rng, n);
  std::vector<float> unused_dgamma(in.gamma.size(), 0.0f), unused_dbeta(in.gamma.size(), 0.0f);
  cpu::layernorm_backward(de.data(), unused_dgamma.data(), unused_dbeta.data(), d.data(),
                          sum.data(), mean.data(), rstd.data(), in.gamma.data(), rows, H);
  auto widen = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  reference_gradients r{widen(g0.dword), widen(g0.dposition), widen(g0.dtoken_type),
                        widen(g0.dgamma), widen(g0.dbeta)};
  for (std::int64_t row = 0; row < rows; ++row) {
    const auto rr = static_cast<std::size_t>(row);
    const std::int64_t t = row % seq, tt = type_of(k.seg, row), id = input_ids[row];
    for (std::int64_t j = 0; j < H; ++j) {
      const auto i = static_cast<std::size_t>(row * H + j), u = static_cast<std::size_t>(j);
      const double xhat = (static_cast<double>(sum[i]) - mean[rr]) * rstd[rr];
      r.dgamma[u] += d[i] * xhat;
      r.dbeta[u] += d[i];
      r.dposition[static_cast<std::size_t>(t * H + j)] += de[i];
      r.dtoken_type[static_cast<std::size_t>(tt * H + j)] += de[i];
      if (id != pad_id)
        r.dword[static_cast<std::size_t>(id * H + j)] += de[i];
    }
  }
  return r;
}

// Table rows the scatter must not touch: pad and unused ids, positions past seq, and
// token type 1 without token type ids. True where a row receives gradient.
struct touched_rows {
  std::vector<bool> word, position, token_type;
};

touched_rows rows_touched(segments seg) {
  touched_rows r{std::vector<bool>(vocab, false), std::vector<bool>(positions, false),
                 std::vector<bool>(types, false)};
  for (std::int64_t row = 0; row < rows; ++row) {
    if (input_ids[row] != pad_id)
      r.word[static_cast<std::size_t>(input_ids[row])] = true;
    r.position[static_cast<std::size_t>(row % seq)] = true;
    r.token_type[static_cast<std::size_t>(type_of(seg, row))] = true;
  }
  return r;
}

// Rows not in `touched` whose bits changed from `before`.
std::int64_t changed_untouched_rows(const std::vector<float>& after,
                                    const std::vector<float>& before,
                                    const std::vector<bool>& touched, std::int64_t hidden) {
  std::int64_t changed = 0;
  const auto h = static_cast<std::size_t>(hidden);
  for (std::size_t r = 0; r < touched.size(); ++r)
    if (!touched[r] && std::memcmp(after.data() + r * h, before.data() + r * h, h * 4) != 0)
      ++changed;
  return changed;
}

// Device copies of the gradients, loaded with `g0`.
struct device_gradients {
  device_gradients(const gradients& g0, std::int64_t hidden)
      : dword(word_bytes(vocab * hidden)), dposition(word_bytes(positions * hidden)),
        dtoken_type(word_bytes(types * hidden)), dgamma(word_bytes(hidden)),
        dbeta(word_bytes(hidden)) {
    test::upload(dword, g0.dword);
    test::upload(dposition, g0.dposition);
    test::upload(dtoken_type, g0.dtoken_type);
    test::upload(dgamma, g0.dgamma);
    test::upload(dbeta, g0.dbeta);
  }
  std::vector<float> get(const device_buffer& b) const {
    return test::download(b, b.bytes() / 4, cuda::elem::f32);
  }

  device_buffer dword, dposition, dtoken_type, dgamma, dbeta;
};

} // namespace

TEST_CASE("cuda embedding backward matches the CPU composition, pad rows untouched") {
  const test::test_stream stream;
  const philox_stream rng = test_rng();
  for_each_case([&](const embedding_case& k) {
    const inputs in(k);
    const forward_run f(in, k, rng, stash::keep, stream);
    const std::int64_t H = k.hidden, n = rows * H;
    const auto nn = static_cast<std::size_t>(n);
    const auto sum = test::download(f.d_sum, nn, k.type);
    const auto mean = test::download(f.d_mean, static_cast<std::size_t>(rows), cuda::elem::f32);
    const auto rstd = test::download(f.d_rstd, static_cast<std::size_t>(rows), cuda::elem::f32);
    const auto dout = test::round_to(random_vector(n, -1.0f, 1.0f, 21), k.type);
    device_buffer d_dout(bytes_of(n, k.type));
    test::upload(d_dout, test::encode(dout, k.type));

    const gradients g0 = preloaded_gradients(H);
    const reference_gradients ref = reference_backward(in, k, rng, dout, sum, mean, rstd, g0);
    auto backward = [&](device_gradients& g, float* dgamma, float* dbeta) {
      DSA_REQUIRE_CUDA(cuda::embedding_backward(
          g.dword.as<float>(), g.dposition.as<float>(), g.dtoken_type.as<float>(), dgamma, dbeta,
          d_dout.as<void>(), f.d_sum.as<void>(), f.d_mean.as<float>(), f.d_rstd.as<float>(),
          in.d_gamma.as<float>(), in.d_ids.as<std::int32_t>(), in.device_types(), pad_id, k.p, rng,
          k.type, rows, seq, H, stream.get()));
      stream.sync();
    };
    device_gradients g(g0, H);
    backward(g, g.dgamma.as<float>(), g.dbeta.as<float>());
    const auto dword = g.get(g.dword), dposition = g.get(g.dposition);
    const auto dtoken_type = g.get(g.dtoken_type), dgamma = g.get(g.dgamma), dbeta = g.get(g.dbeta);
    const auto tol = test::gpu_f32_reduction;
    DSA_CHECK_CLOSE(dword.data(), ref.dword.data(), vocab * H, tol);
    DSA_CHECK_CLOSE(dposition.data(), ref.dposition.data(), positions * H, tol);
    DSA_CHECK_CLOSE(dtoken_type.data(), ref.dtoken_type.data(), types * H, tol);
    DSA_CHECK_CLOSE(dgamma.data(), ref.dgamma.data(), H, tol);
    DSA_CHECK_CLOSE(dbeta.data(), ref.dbeta.data(), H, tol);

    // Rows no token scatters to keep their preloaded bits (the pad row among them).
    const touched_rows touched = rows_touched(k.seg);
    CHECK(!touched.word[static_cast<std::size_t>(pad_id)]);
    CHECK(changed_untouched_rows(dword, g0.dword, touched.word, H) == 0);
    CHECK(changed_untouched_rows(dposition, g0.dposition, touched.position, H) == 0);
    CHECK(changed_untouched_rows(dtoken_type, g0.dtoken_type, touched.token_type, H) == 0);

    // Without dgamma and dbeta: the same table gradients (up to the atomics' order).
    device_gradients g_tables(g0, H);
    backward(g_tables, nullptr, nullptr);
    DSA_CHECK_CLOSE(g_tables.get(g_tables.dword).data(), ref.dword.data(), vocab * H, tol);
    DSA_CHECK_CLOSE(g_tables.get(g_tables.dposition).data(), ref.dposition.data(), positions * H,
                    tol);
    DSA_CHECK_CLOSE(g_tables.get(g_tables.dtoken_type).data(), ref.dtoken_type.data(), types * H,
                    tol);
    CHECK(g_tables.get(g_tables.dgamma) == g0.dgamma);
    CHECK(g_tables.get(g_tables.dbeta) == g0.dbeta);
  });
}

namespace {

// A valid (rows, seq, hidden) = (4, 2, 5) call's buffers, vocab 3 and 2 token types; the
// outputs poisoned, so a refused call that launched anyway shows.
struct small_call {
  static constexpr std::int64_t rows = 4, seq = 2, hidden = 5, vocab = 3, n = rows * hidden;
  small_call();

  device_buffer ids, types, word, position, token_type, gamma, beta, out, sum, mean, rstd;
  device_buffer dword, dposition, dtoken_type, dgamma, dbeta;
};

small_call::small_call()
    : ids(word_bytes(rows)), types(word_bytes(rows)), word(word_bytes(vocab * hidden)),
      position(word_bytes(seq * hidden)), token_type(word_bytes(2 * hidden)),
      gamma(word_bytes(hidden)), beta(word_bytes(hidden)), out(word_bytes(n)), sum(word_bytes(n)),
      mean(word_bytes(rows)), rstd(word_bytes(rows)), dword(word_bytes(vocab * hidden)),
      dposition(word_bytes(seq * hidden)), dtoken_type(word_bytes(2 * hidden)),
      dgamma(word_bytes(hidden)), dbeta(word_bytes(hidden)) {
  upload_ints(ids, {1, 2, 0, 1});
  upload_ints(types, {0, 1, 1, 0});
  test::upload(word, random_vector(vocab * hidden, -1.0f, 1.0f, 41));
  test::upload(position, random_vector(seq * hidden, -1.0f, 1.0f, 42));
  test::upload(token_type, random_vector(2 * hidden, -1.0f, 1.0f, 43));
  test::upload(gamma, random_vector(hidden, 0.5f, 1.5f, 44));
  test::upload(beta, random_vector(hidden, -0.5f, 0.5f, 45));
  for (device_buffer* b :
       {&out, &sum, &mean, &rstd, &dword, &dposition, &dtoken_type, &dgamma, &dbeta})
    poison(*b);
}

// Every pointer and size of one forward call, valid until a test spoils a field.
struct forward_args {
  void* out;
  void* sum;
  float* mean;
  float* rstd;
  const std::int32_t* ids;
  const std::int32_t* token_types;
  const void* word;
  const void* position;
  const void* token_type;
  const float* gamma;
  const float* beta;
  float p = 0.1f;
  cuda::elem type = cuda::elem::f32;
  std::int64_t rows = small_call::rows, seq = small_call::seq, hidden = small_call::hidden;
};

forward_args valid_forward(const small_call& c) {
  return {c.out.as<void>(),    c.sum.as<void>(),         c.mean.as<float>(),
          c.rstd.as<float>(),  c.ids.as<std::int32_t>(), c.types.as<std::int32_t>(),
          c.word.as<void>(),   c.position.as<void>(),    c.token_type.as<void>(),
          c.gamma.as<float>(), c.beta.as<float>()};
}

cudaError_t run_forward(const forward_args& a, const test::test_stream& stream) {
  return cuda::embedding_forward(a.out, a.sum, a.mean, a.rstd, a.ids, a.token_types, a.word,
                                 a.position, a.token_type, a.gamma, a.beta, eps, a.p, test_rng(),
                                 a.type, a.rows, a.seq, a.hidden, stream.get());
}

struct backward_args {
  float* dword;
  float* dposition;
  float* dtoken_type;
  float* dgamma;
  float* dbeta;
  const void* dout;
  const void* sum;
  const float* mean;
  const float* rstd;
  const float* gamma;
  const std::int32_t* ids;
  const std::int32_t* token_types;
  float p = 0.1f;
  cuda::elem type = cuda::elem::f32;
  std::int64_t rows = small_call::rows, seq = small_call::seq, hidden = small_call::hidden;
};

// dout is the forward's out and the stash its sum (finite once the valid forward has run).
backward_args valid_backward(const small_call& c) {
  return {c.dword.as<float>(),  c.dposition.as<float>(),  c.dtoken_type.as<float>(),
          c.dgamma.as<float>(), c.dbeta.as<float>(),      c.out.as<void>(),
          c.sum.as<void>(),     c.mean.as<float>(),       c.rstd.as<float>(),
          c.gamma.as<float>(),  c.ids.as<std::int32_t>(), c.types.as<std::int32_t>()};
}

cudaError_t run_backward(const backward_args& a, const test::test_stream& stream) {
  return cuda::embedding_backward(a.dword, a.dposition, a.dtoken_type, a.dgamma, a.dbeta, a.dout,
                                  a.sum, a.mean, a.rstd, a.gamma, a.ids, a.token_types, pad_id, a.p,
                                  test_rng(), a.type, a.rows, a.seq, a.hidden, stream.get());
}

// The size and rate spoils both launchers refuse.
template <class Args, class Refused> void check_refused_sizes(Refused refused) {
  CHECK(refused([](Args& a) { a.rows = -2; }));
  CHECK(refused([](Args& a) { a.rows = std::int64_t{1} << 32; })); // past a grid, a multiple of seq
  CHECK(refused([](Args& a) { a.rows = 3; }));                     // not whole sequences
  CHECK(refused([](Args& a) { a.seq = 0; }));
  CHECK(refused([](Args& a) { a.seq = -2; }));
  CHECK(refused([](Args& a) { a.hidden = 0; }));
  CHECK(refused([](Args& a) { a.hidden = -5; }));
  // More elements than a Philox stream's 2^32 blocks of four (rows hidden past 2^34).
  CHECK(refused([](Args& a) { a.hidden = (std::int64_t{1} << 32) + 1; }));
  CHECK(refused([](Args& a) {
    a.rows = a.seq = 1;
    a.hidden = (std::int64_t{1} << 34) + 1;
  }));
  CHECK(refused([](Args& a) { a.p = 1.0f; }));
  CHECK(refused([](Args& a) { a.p = -0.25f; }));
  CHECK(refused([](Args& a) { a.p = std::numeric_limits<float>::quiet_NaN(); }));
  CHECK(refused([](Args& a) { a.type = static_cast<cuda::elem>(7); }));
}

bool all_finite(const device_buffer& b) {
  for (const float v : test::download(b, b.bytes() / 4, cuda::elem::f32))
    if (!std::isfinite(v))
      return false;
  return true;
}

} // namespace

TEST_CASE("cuda embedding forward and backward refuse bad sizes and pointers without launching") {
  const test::test_stream stream;
  const small_call c;

  const forward_args good_forward = valid_forward(c);
  auto forward_refused = [&](auto spoil) {
    forward_args a = good_forward;
    spoil(a);
    return run_forward(a, stream) == cudaErrorInvalidValue;
  };
  check_refused_sizes<forward_args>(forward_refused);
  CHECK(forward_refused([](forward_args& a) { a.out = nullptr; }));
  CHECK(forward_refused([](forward_args& a) { a.mean = nullptr; }));
  CHECK(forward_refused([](forward_args& a) { a.rstd = nullptr; }));
  CHECK(forward_refused([](forward_args& a) { a.ids = nullptr; }));
  CHECK(forward_refused([](forward_args& a) { a.word = nullptr; }));
  CHECK(forward_refused([](forward_args& a) { a.position = nullptr; }));
  CHECK(forward_refused([](forward_args& a) { a.token_type = nullptr; }));
  CHECK(forward_refused([](forward_args& a) { a.gamma = nullptr; }));
  CHECK(forward_refused([](forward_args& a) { a.beta = nullptr; }));
  forward_args empty_forward = good_forward;
  empty_forward.rows = 0;
  CHECK(run_forward(empty_forward, stream) == cudaSuccess);

  const backward_args good_backward = valid_backward(c);
  auto backward_refused = [&](auto spoil) {
    backward_args a = good_backward;
    spoil(a);
    return run_backward(a, stream) == cudaErrorInvalidValue;
  };
  check_refused_sizes<backward_args>(backward_refused);
  CHECK(backward_refused([](backward_args& a) { a.dword = nullptr; }));
  CHECK(backward_refused([](backward_args& a) { a.dposition = nullptr; }));
  CHECK(backward_refused([](backward_args& a) { a.dtoken_type = nullptr; }));
  CHECK(backward_refused([](backward_args& a) { a.dout = nullptr; }));
  CHECK(backward_refused([](backward_args& a) { a.sum = nullptr; }));
  CHECK(backward_refused([](backward_args& a) { a.mean = nullptr; }));
  CHECK(backward_refused([](backward_args& a) { a.rstd = nullptr; }));
  CHECK(backward_refused([](backward_args& a) { a.gamma = nullptr; }));
  CHECK(backward_refused([](backward_args& a) { a.ids = nullptr; }));
  backward_args empty_backward = good_backward;
  empty_backward.rows = 0;
  CHECK(run_backward(empty_backward, stream) == cudaSuccess);

  stream.sync();
  CHECK(cudaGetLastError() == cudaSuccess);
  for (const device_buffer* b : {&c.out, &c.sum, &c.mean, &c.rstd, &c.dword, &c.dposition,
                                 &c.dtoken_type, &c.dgamma, &c.dbeta})
    CHECK(all_poisoned(*b)); // nothing ran

  // The unspoiled calls run and write their outputs: the refusals above were the checks'.
  for (const device_buffer* b : {&c.dword, &c.dposition, &c.dtoken_type, &c.dgamma, &c.dbeta})
    DSA_REQUIRE_CUDA(cudaMemset(b->as<void>(), 0, b->bytes()));
  DSA_REQUIRE_CUDA(run_forward(good_forward, stream));
  DSA_REQUIRE_CUDA(run_backward(good_backward, stream));
  stream.sync();
  for (const device_buffer* b : {&c.out, &c.sum, &c.mean, &c.rstd, &c.dword, &c.dposition,
                                 &c.dtoken_type, &c.dgamma, &c.dbeta})
    CHECK(all_finite(*b));
  const auto dword = test::download(c.dword, c.dword.bytes() / 4, cuda::elem::f32);
  CHECK(std::any_of(dword.begin(), dword.end(), [](float v) { return v != 0.0f; }));
}
