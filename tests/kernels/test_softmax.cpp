// Scaled masked softmax vs the double reference, exact zeros for masked keys, rows
// summing to one, backward vs the reference and vs finite differences.
#include "kernels/cpu/softmax.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/dropout.hpp"

#include "tests/support/compare.hpp"
#include "tests/support/isa_paths.hpp"
#include "tests/support/same_bits.hpp"
#include "tests/support/random.hpp"
#include "tests/support/finite_diff.hpp"
#include "tests/support/tolerances.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

using namespace dsa;

namespace {

using test::random_vector;

// (batch, tk) mask: about a third masked; batch 1 (when present) fully masked;
// key 0 of batch 0 always kept.
std::vector<float> make_mask(std::int64_t batch, std::int64_t tk, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> m(static_cast<std::size_t>(batch * tk));
  for (auto& e : m)
    e = gen() % 3 == 0 ? 0.0f : 1.0f;
  m[0] = 1.0f;
  if (batch > 1)
    for (std::int64_t k = 0; k < tk; ++k)
      m[static_cast<std::size_t>(tk + k)] = 0.0f;
  return m;
}

struct shape {
  std::int64_t batch, heads, tq, tk;
  std::int64_t rows() const { return batch * heads * tq; }
  std::int64_t size() const { return rows() * tk; }
};
const shape awkward[] = {
    {1, 1, 1, 1}, {2, 3, 5, 7}, {3, 2, 13, 37}, {2, 4, 3, 129}, {2, 2, 9, 512}};

// sum(dprobs * softmax(scale * scores)) in double: the objective for finite differences.
double objective(const std::vector<double>& scores, const std::vector<double>& dprobs,
                 const float* mask, double scale, const shape& s) {
  double total = 0.0;
  for (std::int64_t r = 0; r < s.rows(); ++r) {
    const float* m = mask + (r / (s.heads * s.tq)) * s.tk;
    double mx = -INFINITY, sum = 0.0;
    for (std::int64_t k = 0; k < s.tk; ++k)
      if (m[k] != 0.0f)
        mx = std::fmax(mx, scale * scores[static_cast<std::size_t>(r * s.tk + k)]);
    for (std::int64_t k = 0; k < s.tk; ++k)
      if (m[k] != 0.0f)
        sum += std::exp(scale * scores[static_cast<std::size_t>(r * s.tk + k)] - mx);
    for (std::int64_t k = 0; k < s.tk; ++k) {
      const auto i = static_cast<std::size_t>(r * s.tk + k);
      if (m[k] != 0.0f)
        total += dprobs[i] * std::exp(scale * scores[i] - mx) / sum;
    }
  }
  return total;
}

} // namespace

TEST_CASE("softmax: forward matches the double reference, with and without a mask, on every path") {
  const float scale = 0.125f;
  for (cpu::isa path : test::isa_paths())
  for (const auto& s : awkward) {
    CAPTURE(cpu::isa_name(path));
    CAPTURE(s.batch);
    CAPTURE(s.tk);
    const auto scores = random_vector(s.size(), -40.0f, 40.0f, 1); // scale * 40 = 5
    const auto mask = make_mask(s.batch, s.tk, 2);
    for (const float* m : {static_cast<const float*>(nullptr), mask.data()}) {
      CAPTURE(m != nullptr);
      std::vector<float> probs(scores.size()), probs_ref(scores.size());
      cpu::softmax_forward(path, probs.data(), scores.data(), m, scale, s.batch, s.heads, s.tq, s.tk);
      cpu::softmax_forward_ref(probs_ref.data(), scores.data(), m, scale, s.batch, s.heads, s.tq,
                               s.tk);
      DSA_CHECK_CLOSE(probs.data(), probs_ref.data(), s.size(), test::f32_kernel);
    }
  }
}

TEST_CASE("softmax: masked keys are exactly zero, fully masked rows are zero, others sum to one") {
  const float scale = 1.0f;
  for (const auto& s : awkward) {
    CAPTURE(s.batch);
    CAPTURE(s.tk);
    auto scores = random_vector(s.size(), -60.0f, 60.0f, 3); // wide range: needs the max shift
    const auto mask = make_mask(s.batch, s.tk, 4);
    std::vector<float> probs(scores.size());
    cpu::softmax_forward(probs.data(), scores.data(), mask.data(), scale, s.batch, s.heads, s.tq,
                         s.tk);
    std::int64_t bad_zero = 0, nonfinite = 0;
    for (std::int64_t r = 0; r < s.rows(); ++r) {
      const float* m = mask.data() + (r / (s.heads * s.tq)) * s.tk;
      const float* p = probs.data() + r * s.tk;
      bool any = false;
      double sum = 0.0;
      for (std::int64_t k = 0; k < s.tk; ++k) {
        if (!std::isfinite(p[k]))
          ++nonfinite;
        if (m[k] == 0.0f && p[k] != 0.0f)
          ++bad_zero;
        any = any || m[k] != 0.0f;
        sum += p[k];
      }
      const double want = any ? 1.0 : 0.0;
      DSA_CHECK_CLOSE(&sum, &want, 1, test::f32_kernel);
    }
    CHECK(bad_zero == 0);
    CHECK(nonfinite == 0);
    // In place gives the same bits.
    cpu::softmax_forward(scores.data(), scores.data(), mask.data(), scale, s.batch, s.heads, s.tq,
                         s.tk);
    CHECK(scores == probs);
  }
}

TEST_CASE("softmax: backward matches the double reference, also in place, on every path") {
  const float scale = 0.125f;
  for (cpu::isa path : test::isa_paths())
  for (const auto& s : awkward) {
    CAPTURE(cpu::isa_name(path));
    CAPTURE(s.batch);
    CAPTURE(s.tk);
    const auto scores = random_vector(s.size(), -40.0f, 40.0f, 5);
    const auto dprobs = random_vector(s.size(), -1.0f, 1.0f, 6);
    const auto mask = make_mask(s.batch, s.tk, 7);
    std::vector<float> probs(scores.size()), ds(scores.size()), ds_ref(scores.size());
    cpu::softmax_forward_ref(probs.data(), scores.data(), mask.data(), scale, s.batch, s.heads,
                             s.tq, s.tk);
    cpu::softmax_backward(path, ds.data(), dprobs.data(), probs.data(), scale, s.rows(), s.tk);
    cpu::softmax_backward_ref(ds_ref.data(), dprobs.data(), probs.data(), scale, s.rows(), s.tk);
    DSA_CHECK_CLOSE(ds.data(), ds_ref.data(), s.size(), test::f32_kernel);
    auto inplace = dprobs;
    cpu::softmax_backward(path, inplace.data(), inplace.data(), probs.data(), scale, s.rows(), s.tk);
    CHECK(inplace == ds);
  }
}

TEST_CASE("softmax: backward equals central differences of the double forward") {
  const shape s{2, 2, 3, 11};
  const float scale = 0.5f;
  const auto scores_f = random_vector(s.size(), -3.0f, 3.0f, 8);
  const auto dprobs_f = random_vector(s.size(), -1.0f, 1.0f, 9);
  const auto mask = make_mask(s.batch, s.tk, 10);
  std::vector<double> scores(scores_f.begin(), scores_f.end()),
      dprobs(dprobs_f.begin(), dprobs_f.end());
  auto f = [&] { return objective(scores, dprobs, mask.data(), scale, s); };
  const auto fd = test::central_difference(scores, f, 1e-6);

  std::vector<float> probs(scores_f.size()), ds(scores_f.size());
  cpu::softmax_forward_ref(probs.data(), scores_f.data(), mask.data(), scale, s.batch, s.heads,
                           s.tq, s.tk);
  { // the double objective is the reference forward's
    double from_ref = 0.0;
    for (std::size_t i = 0; i < probs.size(); ++i)
      from_ref += static_cast<double>(dprobs_f[i]) * probs[i];
    const double direct = f();
    DSA_CHECK_CLOSE(&from_ref, &direct, 1, test::f32_kernel);
  }
  cpu::softmax_backward_ref(ds.data(), dprobs_f.data(), probs.data(), scale, s.rows(), s.tk);
  DSA_CHECK_CLOSE(ds.data(), fd.data(), s.size(), test::finite_diff);

  cpu::softmax_forward(probs.data(), scores_f.data(), mask.data(), scale, s.batch, s.heads, s.tq,
                       s.tk);
  cpu::softmax_backward(ds.data(), dprobs_f.data(), probs.data(), scale, s.rows(), s.tk);
  DSA_CHECK_CLOSE(ds.data(), fd.data(), s.size(), test::f32_kernel);
}

TEST_CASE("softmax: one key gives probability one; equal scores give a uniform row") {
  const float one_score = 123.0f, one_mask = 1.0f;
  float p = 0.0f;
  cpu::softmax_forward(&p, &one_score, &one_mask, 1.0f, 1, 1, 1, 1);
  CHECK(p == 1.0f);
  std::vector<float> scores(7, 2.5f), probs(7);
  cpu::softmax_forward(probs.data(), scores.data(), nullptr, 1.0f, 1, 1, 1, 7);
  const std::vector<double> uniform(7, 1.0 / 7.0);
  DSA_CHECK_CLOSE(probs.data(), uniform.data(), 7, test::f32_kernel);
}

TEST_CASE("softmax backward from f16 / bf16 probabilities: the bits of the f32 form on the widened values, every path") {
  for (auto [rows, tk] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {7, 37}, {300, 128}}) {
    const std::int64_t n = rows * tk;
    const auto probs = random_vector(n, 0.0f, 1.0f, 61);
    const auto dprobs = random_vector(n, -1.0f, 1.0f, 62);
    for (dtype half : {dtype::f16, dtype::bf16}) {
      std::vector<std::uint16_t> ph(static_cast<std::size_t>(n));
      std::vector<float> widened(static_cast<std::size_t>(n));
      cpu::cast(ph.data(), half, probs.data(), dtype::f32, n);
      cpu::cast(widened.data(), dtype::f32, ph.data(), half, n);
      for (cpu::isa path : test::isa_paths()) {
        INFO(cpu::isa_name(path) << " " << dtype_name(half) << " rows " << rows << " tk " << tk);
        std::vector<float> want(static_cast<std::size_t>(n)), got = dprobs; // in place, as attention calls it
        cpu::softmax_backward(path, want.data(), dprobs.data(), widened.data(), 0.125f, rows, tk);
        cpu::softmax_backward(path, got.data(), got.data(), ph.data(), half, 0.125f, rows, tk);
        CHECK(dsa::test::same_bits(got, want));
      }
    }
  }
}

TEST_CASE("softmax + dropout fused: the bits of softmax, cast, dropout and cast, forward and backward, every path") {
  const philox_stream stream{0x5eedull, 3, 1, 2, 1};
  for (const shape& s : awkward) {
    const std::int64_t n = s.size();
    const auto N = static_cast<std::size_t>(n);
    const auto scores = random_vector(n, -4.0f, 4.0f, 71);
    const auto mask_values = make_mask(s.batch, s.tk, 72);
    const auto grad = random_vector(n, -1.0f, 1.0f, 73);
    const float scale = 0.35f;
    for (const float* mask : {mask_values.data(), static_cast<const float*>(nullptr)})
    for (float p : {0.0f, 0.1f, 0.45f}) {
      for (dtype half : {dtype::f16, dtype::bf16}) {
        for (cpu::isa path : test::isa_paths()) {
          INFO(cpu::isa_name(path) << " " << dtype_name(half) << " p " << p << " shape " << s.batch << "x" << s.heads
                                   << "x" << s.tq << "x" << s.tk << (mask ? " masked" : " no mask"));
          // The unfused sequence.
          std::vector<float> probs(N), dropped(N), dscores(N);
          std::vector<std::uint16_t> probs_half(N), dropped_half(N);
          cpu::softmax_forward(path, probs.data(), scores.data(), mask, scale, s.batch, s.heads, s.tq, s.tk);
          cpu::cast(path, probs_half.data(), half, probs.data(), dtype::f32, n);
          if (p > 0.0f) {
            cpu::dropout_forward(path, dropped.data(), nullptr, probs.data(), p, stream, n);
            cpu::cast(path, dropped_half.data(), half, dropped.data(), dtype::f32, n);
          }
          std::vector<float> undropped = grad;
          if (p > 0.0f) cpu::dropout_forward(path, undropped.data(), nullptr, grad.data(), p, stream, n);
          cpu::softmax_backward(path, dscores.data(), undropped.data(), probs_half.data(), half, scale, s.rows(), s.tk);

          // Fused, every output at once (f32 probs in place over the scores).
          std::vector<float> got_probs = scores, got_dropped(N, -1.0f);
          std::vector<std::uint16_t> got_probs_half(N), got_dropped_half(N);
          cpu::softmax_dropout_out out;
          out.probs = got_probs.data();
          out.probs_half = got_probs_half.data();
          out.dropped = p > 0.0f ? got_dropped.data() : nullptr;
          out.dropped_half = p > 0.0f ? got_dropped_half.data() : nullptr;
          out.half_type = half;
          cpu::softmax_dropout_forward(path, out, got_probs.data(), mask, scale, p, stream, s.batch, s.heads,
                                       s.tq, s.tk);
          CHECK(test::same_bits(got_probs, probs));
          CHECK(got_probs_half == probs_half);
          if (p > 0.0f) {
            CHECK(test::same_bits(got_dropped, dropped));
            CHECK(got_dropped_half == dropped_half);
          }
          // Only the half outputs (the row goes through the kernel's own buffers).
          if (p > 0.0f) {
            std::vector<std::uint16_t> only_probs(N), only_dropped(N);
            cpu::softmax_dropout_out halves;
            halves.probs_half = only_probs.data();
            halves.dropped_half = only_dropped.data();
            halves.half_type = half;
            cpu::softmax_dropout_forward(path, halves, scores.data(), mask, scale, p, stream, s.batch,
                                         s.heads, s.tq, s.tk);
            CHECK(only_probs == probs_half);
            CHECK(only_dropped == dropped_half);
            // The half stash of both and f32 dropped probabilities (an f16 stash, or
            // attn_dropout_checkpoint).
            std::vector<float> with_dropped(N);
            halves.dropped = with_dropped.data();
            cpu::softmax_dropout_forward(path, halves, scores.data(), mask, scale, p, stream, s.batch, s.heads,
                                         s.tq, s.tk);
            CHECK(only_probs == probs_half);
            CHECK(only_dropped == dropped_half);
            CHECK(test::same_bits(with_dropped, dropped));
          }
          // Backward in place, as attention calls it.
          std::vector<float> got_ds = grad;
          cpu::softmax_dropout_backward(path, got_ds.data(), got_ds.data(), probs_half.data(), half, scale, p, stream,
                                        s.rows(), s.tk);
          CHECK(test::same_bits(got_ds, dscores));
          // Only its bf16 rounding written.
          std::vector<std::uint16_t> want_ds16(N), got_ds16(N);
          cpu::cast(path, want_ds16.data(), dtype::bf16, dscores.data(), dtype::f32, n);
          cpu::softmax_dropout_backward_bf16(path, got_ds16.data(), grad.data(), probs_half.data(), half, scale, p,
                                             stream, s.rows(), s.tk);
          CHECK(got_ds16 == want_ds16);
        }
      }
    }
  }
}
