// The CUDA softmax with dropout (kernels/cuda/softmax.hpp) against its CPU twin
// (cpu::softmax_dropout_forward / backward on the scalar path) from the same rounded inputs,
// in f32, f16 and bf16: zeros (masked keys, dropped elements) at exactly the same places,
// values within the row-reduction tolerance; the in-place and single-output forms; bad
// arguments refused without a launch.
#include "kernels/cpu/softmax.hpp"
#include "kernels/cuda/softmax.hpp"

#include "tests/gpu/gpu_test_util.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/random.hpp"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

using namespace dsa;
using test::device_buffer;

namespace {

constexpr cuda::elem all_types[] = {cuda::elem::f32, cuda::elem::f16, cuda::elem::bf16};
struct attention_shape {
  std::int64_t batch, heads, tq, tk;
};
// A prime key length, one just past BERT's 128, a single key and 33 (the warp kernel element
// by element), one past four block widths (the block kernel), BERT's 128, 384 and 512 (the
// warp kernel with vector loads, one, three and four chunks per lane) and 1021 (its longest
// row when tk % 4 != 0, starting at every offset within a Philox block). With 15 rows, the
// last warp of two rows holds one past the end.
constexpr attention_shape shapes[] = {{3, 2, 5, 37},   {3, 2, 5, 130}, {3, 2, 5, 1},
                                      {2, 1, 3, 1031}, {3, 1, 5, 128}, {3, 1, 5, 384},
                                      {3, 1, 3, 512},  {3, 1, 5, 33},  {2, 1, 3, 1021}};
constexpr float score_scale = 0.3f;
constexpr philox_stream rng{0x0123456789abcdefULL, 7, 2, 3, 1};

std::size_t bytes_of(std::int64_t n, cuda::elem type) {
  return static_cast<std::size_t>(n * cuda::elem_size(type));
}

// Every byte 0xff: a NaN in f32, f16 and bf16, so an element left unwritten fails.
void poison(device_buffer& b) {
  DSA_REQUIRE_CUDA(cudaMemset(b.as<void>(), 0xff, b.bytes()));
}

// (batch, tk): batch 1 fully masked, every third key of batch 0 and every fifth of the
// others masked (with one key, batches 0 and 2 attend to it).
std::vector<float> make_key_mask(const attention_shape& s) {
  std::vector<float> mask(static_cast<std::size_t>(s.batch * s.tk));
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t k = 0; k < s.tk; ++k) {
      const bool masked = b == 1 || (b == 0 && k % 3 == 2) || (b >= 2 && k % 5 == 4);
      mask[static_cast<std::size_t>(b * s.tk + k)] = masked ? 0.0f : 1.0f;
    }
  return mask;
}

// Masked keys and dropped elements are exact zeros on both sides (the inputs keep every
// attended probability far from underflow); an unwritten NaN counts as nonzero.
void check_same_zeros(const std::vector<float>& actual, const std::vector<float>& expected) {
  REQUIRE(actual.size() == expected.size());
  std::int64_t mismatches = 0, first = -1;
  for (std::size_t i = 0; i < actual.size(); ++i)
    if ((actual[i] == 0.0f) != (expected[i] == 0.0f)) {
      if (first < 0)
        first = static_cast<std::int64_t>(i);
      ++mismatches;
    }
  INFO("zeros at different places: " << mismatches << " elements, the first at " << first);
  CHECK(mismatches == 0);
}

// The CPU twin's outputs rounded to `type` (what the kernel stores); dropped only for p > 0.
struct forward_twin {
  std::vector<float> probs, dropped;
};
forward_twin twin_forward(const std::vector<float>& scores, const float* key_mask, float p,
                          const attention_shape& s, cuda::elem type) {
  forward_twin t{std::vector<float>(scores.size()), std::vector<float>(scores.size())};
  cpu::softmax_dropout_out out;
  out.probs = t.probs.data();
  out.dropped = p > 0.0f ? t.dropped.data() : nullptr;
  cpu::softmax_dropout_forward(cpu::isa::scalar, out, scores.data(), key_mask, score_scale, p, rng,
                               s.batch, s.heads, s.tq, s.tk);
  t.probs = test::round_to(t.probs, type);
  t.dropped = test::round_to(t.dropped, type);
  return t;
}

} // namespace

TEST_CASE("cuda softmax_dropout forward and backward match the CPU twin") {
  const test::test_stream stream;
  for (auto type : all_types) {
    for (const auto& s : shapes) {
      for (float p : {0.1f, 0.0f}) {
        for (bool masked : {true, false}) {
          INFO(std::string(test::elem_name(type))
               << " batch=" << s.batch << " heads=" << s.heads << " tq=" << s.tq << " tk=" << s.tk
               << " p=" << p << " key_mask=" << (masked ? "yes" : "null"));
          const std::int64_t rows = s.batch * s.heads * s.tq, n = rows * s.tk;
          const auto nn = static_cast<std::size_t>(n);
          const auto tol = test::storage_tolerance(type, test::gpu_f32_reduction);
          const auto scores = test::round_to(test::random_vector(n, -5.0f, 5.0f, 41), type);
          const auto mask = make_key_mask(s);
          const forward_twin twin =
              twin_forward(scores, masked ? mask.data() : nullptr, p, s, type);

          device_buffer d_scores(bytes_of(n, type)), d_probs(bytes_of(n, type)),
              d_dropped(bytes_of(n, type)), d_mask(mask.size() * 4);
          test::upload(d_scores, test::encode(scores, type));
          test::upload(d_mask, mask);
          const float* key_mask = masked ? d_mask.as<float>() : nullptr;
          auto forward = [&](void* probs, void* dropped) {
            DSA_REQUIRE_CUDA(cuda::softmax_dropout_forward(
                probs, dropped, d_scores.as<void>(), key_mask, score_scale, p, rng, type, s.batch,
                s.heads, s.tq, s.tk, stream.get()));
            stream.sync();
          };
          if (p > 0.0f) {
            poison(d_probs);
            poison(d_dropped);
            forward(d_probs.as<void>(), d_dropped.as<void>());
            const auto probs = test::download(d_probs, nn, type);
            const auto dropped = test::download(d_dropped, nn, type);
            DSA_CHECK_CLOSE(probs.data(), twin.probs.data(), n, tol);
            DSA_CHECK_CLOSE(dropped.data(), twin.dropped.data(), n, tol);
            check_same_zeros(probs, twin.probs);
            check_same_zeros(dropped, twin.dropped);
            // The dropped probabilities alone.
            poison(d_dropped);
            forward(nullptr, d_dropped.as<void>());
            const auto dropped_only = test::download(d_dropped, nn, type);
            DSA_CHECK_CLOSE(dropped_only.data(), twin.dropped.data(), n, tol);
            check_same_zeros(dropped_only, twin.dropped);
          } else {
            // The probabilities written over the scores: the aliasing the header allows.
            forward(d_scores.as<void>(), nullptr);
            const auto probs = test::download(d_scores, nn, type);
            DSA_CHECK_CLOSE(probs.data(), twin.probs.data(), n, tol);
            check_same_zeros(probs, twin.probs);
          }

          // Backward from the twin's stored probabilities, so its error is the backward's alone.
          const auto ddropped = test::round_to(test::random_vector(n, -1.0f, 1.0f, 42), type);
          std::vector<float> dscores_twin(nn);
          cpu::softmax_dropout_backward(cpu::isa::scalar, dscores_twin.data(), ddropped.data(),
                                        twin.probs.data(), dtype::f32, score_scale, p, rng, rows,
                                        s.tk);
          dscores_twin = test::round_to(dscores_twin, type);
          device_buffer d_ddropped(bytes_of(n, type)), d_probs_in(bytes_of(n, type)),
              d_dscores(bytes_of(n, type));
          test::upload(d_ddropped, test::encode(ddropped, type));
          test::upload(d_probs_in, test::encode(twin.probs, type));
          // With dropout, dscores written over ddropped (the aliasing the header allows).
          device_buffer& out = p > 0.0f ? d_ddropped : d_dscores;
          if (p == 0.0f)
            poison(d_dscores);
          DSA_REQUIRE_CUDA(cuda::softmax_dropout_backward(out.as<void>(), d_ddropped.as<void>(),
                                                          d_probs_in.as<void>(), score_scale, p,
                                                          rng, type, rows, s.tk, stream.get()));
          stream.sync();
          const auto dscores = test::download(out, nn, type);
          DSA_CHECK_CLOSE(dscores.data(), dscores_twin.data(), n, tol);
        }
      }
    }
  }
}

TEST_CASE("cuda softmax_dropout refuses bad sizes, missing outputs and bad p without launching") {
  const test::test_stream stream;
  const std::int64_t batch = 2, heads = 3, tq = 4, tk = 5, rows = batch * heads * tq, n = rows * tk;
  const auto nn = static_cast<std::size_t>(n);
  device_buffer d_in(nn * 4), d_out(nn * 4), d_out2(nn * 4);
  test::upload(d_in, test::random_vector(n, -1.0f, 1.0f, 51));
  poison(d_out);
  poison(d_out2);
  const auto before = test::download_bytes(d_out, nn * 4);
  void* in = d_in.as<void>();
  void* out = d_out.as<void>();
  void* out2 = d_out2.as<void>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto f32 = cuda::elem::f32;
  const auto invalid = cudaErrorInvalidValue;

  auto forward = [&](void* probs, void* dropped, const void* scores, float p, cuda::elem type,
                     std::int64_t b, std::int64_t h, std::int64_t q, std::int64_t k) {
    return cuda::softmax_dropout_forward(probs, dropped, scores, nullptr, 0.5f, p, rng, type, b, h,
                                         q, k, stream.get());
  };
  CHECK(forward(nullptr, nullptr, in, 0.1f, f32, batch, heads, tq, tk) == invalid); // no output
  CHECK(forward(out, nullptr, nullptr, 0.0f, f32, batch, heads, tq, tk) == invalid);
  CHECK(forward(out, out2, in, 0.0f, f32, batch, heads, tq, tk) == invalid); // dropped, p == 0
  CHECK(forward(nullptr, out2, in, 1.0f, f32, batch, heads, tq, tk) == invalid);
  CHECK(forward(nullptr, out2, in, -0.1f, f32, batch, heads, tq, tk) == invalid);
  CHECK(forward(nullptr, out2, in, nan, f32, batch, heads, tq, tk) == invalid);
  CHECK(forward(out, nullptr, in, 0.0f, f32, batch, heads, tq, 0) == invalid);
  CHECK(forward(out, nullptr, in, 0.0f, f32, -1, heads, tq, tk) == invalid);
  CHECK(forward(out, nullptr, in, 0.0f, f32, batch, -1, tq, tk) == invalid);
  CHECK(forward(out, nullptr, in, 0.0f, f32, batch, heads, -1, tk) == invalid);
  CHECK(forward(out, nullptr, in, 0.0f, f32, 1 << 20, 1 << 10, 1 << 10, tk) == invalid); // rows
  // 2^35 elements: more than the stream's 2^32 Philox blocks.
  CHECK(forward(nullptr, out2, in, 0.1f, f32, 1 << 10, 1 << 10, 1 << 10, 32) == invalid);
  const auto bad_type = static_cast<cuda::elem>(7);
  CHECK(forward(out, nullptr, in, 0.0f, bad_type, batch, heads, tq, tk) == invalid);
  CHECK(forward(out, nullptr, in, 0.0f, f32, 0, heads, tq, tk) == cudaSuccess); // no rows

  auto backward = [&](void* dscores, const void* ddropped, const void* probs, float p,
                      cuda::elem type, std::int64_t r, std::int64_t k) {
    return cuda::softmax_dropout_backward(dscores, ddropped, probs, 0.5f, p, rng, type, r, k,
                                          stream.get());
  };
  CHECK(backward(nullptr, in, in, 0.1f, f32, rows, tk) == invalid);
  CHECK(backward(out, nullptr, in, 0.1f, f32, rows, tk) == invalid);
  CHECK(backward(out, in, nullptr, 0.1f, f32, rows, tk) == invalid);
  CHECK(backward(out, in, in, 1.0f, f32, rows, tk) == invalid);
  CHECK(backward(out, in, in, -0.1f, f32, rows, tk) == invalid);
  CHECK(backward(out, in, in, nan, f32, rows, tk) == invalid);
  CHECK(backward(out, in, in, 0.1f, f32, -1, tk) == invalid);
  CHECK(backward(out, in, in, 0.1f, f32, rows, 0) == invalid);
  CHECK(backward(out, in, in, 0.0f, f32, std::int64_t{1} << 31, tk) == invalid); // rows
  CHECK(backward(out, in, in, 0.1f, f32, std::int64_t{1} << 30, 32) == invalid); // 2^35 elements
  CHECK(backward(out, in, in, 0.1f, bad_type, rows, tk) == invalid);
  CHECK(backward(out, in, in, 0.1f, f32, 0, tk) == cudaSuccess); // no rows

  stream.sync();
  DSA_REQUIRE_CUDA(cudaGetLastError());
  CHECK(test::download_bytes(d_out, nn * 4) == before);
  CHECK(test::download_bytes(d_out2, nn * 4) == before);
}
