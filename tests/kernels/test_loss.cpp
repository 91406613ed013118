// Sparse softmax cross-entropy: a hand-computed case, the double reference at awkward
// sizes and extreme logits, ignore_index, and backward vs finite differences.
#include "kernels/cpu/loss.hpp"

#include "tests/support/compare.hpp"
#include "tests/support/isa_paths.hpp"
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

constexpr std::int32_t ignore = -100;

using test::random_vector;

// Labels in [0, classes), about a quarter ignored (row 0 never is).
std::vector<std::int32_t> random_labels(std::int64_t rows, std::int64_t classes,
                                        std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  for (auto& l : labels)
    l = gen() % 4 == 0 ? ignore
                       : static_cast<std::int32_t>(gen() % static_cast<std::uint32_t>(classes));
  if (labels[0] == ignore)
    labels[0] = 0;
  return labels;
}

// Mean cross-entropy over counted rows, in double: the objective for finite differences.
double mean_loss(const std::vector<double>& logits, const std::vector<std::int32_t>& labels,
                 std::int64_t rows, std::int64_t classes) {
  double total = 0.0;
  std::int64_t count = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t label = labels[static_cast<std::size_t>(r)];
    if (label == ignore)
      continue;
    const double* x = logits.data() + r * classes;
    double mx = x[0], sum = 0.0;
    for (std::int64_t j = 1; j < classes; ++j)
      mx = std::fmax(mx, x[j]);
    for (std::int64_t j = 0; j < classes; ++j)
      sum += std::exp(x[j] - mx);
    total += std::log(sum) + mx - x[label];
    ++count;
  }
  return total / static_cast<double>(count);
}

// scale * (softmax - onehot) in double, 0 for ignored rows: the backward's reference.
std::vector<double> gradient_ref(const std::vector<float>& logits,
                                 const std::vector<std::int32_t>& labels, double scale,
                                 std::int64_t rows, std::int64_t classes) {
  std::vector<double> d(logits.size(), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t label = labels[static_cast<std::size_t>(r)];
    if (label == ignore)
      continue;
    const float* x = logits.data() + r * classes;
    double mx = x[0], sum = 0.0;
    for (std::int64_t j = 1; j < classes; ++j)
      mx = std::fmax(mx, static_cast<double>(x[j]));
    for (std::int64_t j = 0; j < classes; ++j)
      sum += std::exp(x[j] - mx);
    for (std::int64_t j = 0; j < classes; ++j)
      d[static_cast<std::size_t>(r * classes + j)] =
          scale * (std::exp(x[j] - mx) / sum - (j == label));
  }
  return d;
}

struct sizes {
  std::int64_t rows, classes;
};
const sizes awkward[] = {{1, 1}, {1, 2}, {7, 13}, {37, 1031}, {64, 30522}};

} // namespace

TEST_CASE("cross_entropy: hand-computed logits [0, ln 3]") {
  const std::vector<float> logits{0.0f, std::log(3.0f)};
  const std::int32_t label1 = 1, label0 = 0;
  const auto one = cpu::cross_entropy_forward(logits.data(), &label1, ignore, 1, 2);
  const double want1 = std::log(4.0 / 3.0), want0 = std::log(4.0);
  DSA_CHECK_CLOSE(&one.loss_sum, &want1, 1, test::f32_kernel);
  CHECK(one.count == 1);
  CHECK(one.correct == 1);
  const auto zero = cpu::cross_entropy_forward(logits.data(), &label0, ignore, 1, 2);
  DSA_CHECK_CLOSE(&zero.loss_sum, &want0, 1, test::f32_kernel);
  CHECK(zero.count == 1);
  CHECK(zero.correct == 0);
  std::vector<float> d(2);
  cpu::cross_entropy_backward(d.data(), logits.data(), &label1, ignore, 1.0f, 1, 2);
  const std::vector<double> want_d{0.25, -0.25};
  DSA_CHECK_CLOSE(d.data(), want_d.data(), 2, test::f32_kernel);
}

TEST_CASE("cross_entropy: forward and backward match the double reference at awkward sizes, on every path") {
  for (cpu::isa path : test::isa_paths())
  for (auto [rows, classes] : awkward) {
    CAPTURE(cpu::isa_name(path));
    CAPTURE(rows);
    CAPTURE(classes);
    const auto logits = random_vector(rows * classes, -8.0f, 8.0f, 1);
    const auto labels = random_labels(rows, classes, 2);
    const auto got =
        cpu::cross_entropy_forward(path, logits.data(), labels.data(), ignore, rows, classes);
    const auto want =
        cpu::cross_entropy_forward_ref(logits.data(), labels.data(), ignore, rows, classes);
    DSA_CHECK_CLOSE(&got.loss_sum, &want.loss_sum, 1, test::f32_kernel);
    CHECK(got.count == want.count);
    CHECK(got.correct == want.correct);

    const float scale = 1.0f / static_cast<float>(want.count);
    std::vector<float> d(logits.size());
    cpu::cross_entropy_backward(path, d.data(), logits.data(), labels.data(), ignore, scale, rows,
                                classes);
    const auto d_ref = gradient_ref(logits, labels, scale, rows, classes);
    DSA_CHECK_CLOSE(d.data(), d_ref.data(), rows * classes, test::f32_kernel);
    auto inplace = logits;
    cpu::cross_entropy_backward(path, inplace.data(), inplace.data(), labels.data(), ignore, scale, rows,
                                classes);
    CHECK(inplace == d);
  }
}

TEST_CASE("cross_entropy: extreme logits stay finite and match the reference") {
  const std::int64_t rows = 5, classes = 17;
  auto logits = random_vector(rows * classes, -1e4f, 1e4f, 3);
  logits[3] = 8e4f;   // row 0 dominated by one class
  logits[17] = -8e4f; // row 1 has a hugely negative class
  const std::vector<std::int32_t> labels{3, 0, 16, 5, 9};
  const auto got = cpu::cross_entropy_forward(logits.data(), labels.data(), ignore, rows, classes);
  const auto want =
      cpu::cross_entropy_forward_ref(logits.data(), labels.data(), ignore, rows, classes);
  CHECK(std::isfinite(got.loss_sum));
  DSA_CHECK_CLOSE(&got.loss_sum, &want.loss_sum, 1, test::f32_kernel);
  CHECK(got.correct == want.correct);
  std::vector<float> d(logits.size());
  cpu::cross_entropy_backward(d.data(), logits.data(), labels.data(), ignore, 0.2f, rows, classes);
  const auto d_ref = gradient_ref(logits, labels, 0.2, rows, classes);
  DSA_CHECK_CLOSE(d.data(), d_ref.data(), rows * classes, test::f32_kernel);
}

TEST_CASE("cross_entropy: ignored rows contribute nothing; count and correct are right") {
  const std::int64_t rows = 9, classes = 6;
  auto logits = random_vector(rows * classes, -3.0f, 3.0f, 4);
  std::vector<std::int32_t> labels(rows, ignore);
  // Rows 1, 4, 6 counted: rows 1 and 6 labelled with their argmax, row 4 not.
  auto argmax = [&](std::int64_t r) {
    std::int32_t best = 0;
    for (std::int32_t j = 1; j < classes; ++j)
      if (logits[static_cast<std::size_t>(r * classes + j)] >
          logits[static_cast<std::size_t>(r * classes + best)])
        best = j;
    return best;
  };
  labels[1] = argmax(1);
  labels[4] = (argmax(4) + 1) % static_cast<std::int32_t>(classes);
  labels[6] = argmax(6);
  const auto all = cpu::cross_entropy_forward(logits.data(), labels.data(), ignore, rows, classes);
  CHECK(all.count == 3);
  CHECK(all.correct == 2);

  // The same loss from the counted rows alone; ignored rows may hold anything.
  std::vector<float> kept;
  std::vector<std::int32_t> kept_labels;
  for (std::int64_t r : {1, 4, 6}) {
    kept.insert(kept.end(), logits.begin() + r * classes, logits.begin() + (r + 1) * classes);
    kept_labels.push_back(labels[static_cast<std::size_t>(r)]);
  }
  for (std::int64_t j = 0; j < classes; ++j)
    logits[static_cast<std::size_t>(j)] = 1e30f; // row 0 ignored
  const auto again =
      cpu::cross_entropy_forward(logits.data(), labels.data(), ignore, rows, classes);
  const auto only = cpu::cross_entropy_forward(kept.data(), kept_labels.data(), ignore, 3, classes);
  CHECK(again.loss_sum == only.loss_sum);
  CHECK(again.count == only.count);
  CHECK(again.correct == only.correct);

  std::vector<float> d(logits.size(), 7.0f);
  cpu::cross_entropy_backward(d.data(), logits.data(), labels.data(), ignore, 1.0f / 3.0f, rows,
                              classes);
  std::int64_t nonzero_ignored = 0;
  for (std::int64_t r = 0; r < rows; ++r)
    if (labels[static_cast<std::size_t>(r)] == ignore)
      for (std::int64_t j = 0; j < classes; ++j)
        nonzero_ignored += d[static_cast<std::size_t>(r * classes + j)] != 0.0f;
  CHECK(nonzero_ignored == 0);

  const std::vector<std::int32_t> none(rows, ignore);
  const auto empty = cpu::cross_entropy_forward(logits.data(), none.data(), ignore, rows, classes);
  CHECK(empty.count == 0);
  CHECK(empty.correct == 0);
  CHECK(empty.loss_sum == 0.0);
}

TEST_CASE("cross_entropy: backward equals central differences of the double mean loss") {
  const std::int64_t rows = 5, classes = 11;
  const auto logits_f = random_vector(rows * classes, -4.0f, 4.0f, 5);
  std::vector<std::int32_t> labels{3, ignore, 0, 10, 7};
  std::vector<double> logits(logits_f.begin(), logits_f.end());
  auto f = [&] { return mean_loss(logits, labels, rows, classes); };
  const auto fd = test::central_difference(logits, f, 1e-6);

  const auto ref =
      cpu::cross_entropy_forward_ref(logits_f.data(), labels.data(), ignore, rows, classes);
  const double ref_mean = ref.loss_sum / static_cast<double>(ref.count), direct = f();
  DSA_CHECK_CLOSE(&ref_mean, &direct, 1, test::finite_diff); // same double arithmetic
  const double scale = 1.0 / static_cast<double>(ref.count);
  const auto d_ref = gradient_ref(logits_f, labels, scale, rows, classes);
  DSA_CHECK_CLOSE(d_ref.data(), fd.data(), rows * classes, test::finite_diff);

  std::vector<float> d(logits_f.size());
  cpu::cross_entropy_backward(d.data(), logits_f.data(), labels.data(), ignore,
                              static_cast<float>(scale), rows, classes);
  DSA_CHECK_CLOSE(d.data(), fd.data(), rows * classes, test::f32_kernel);
}

TEST_CASE("cross_entropy_mean_grad: the bias add, forward and backward of the mean loss in one pass") {
  for (cpu::isa path : test::isa_paths())
  for (auto [rows, classes] : awkward)
  for (bool with_bias : {false, true}) {
    CAPTURE(cpu::isa_name(path));
    CAPTURE(rows);
    CAPTURE(classes);
    CAPTURE(with_bias);
    const auto raw = random_vector(rows * classes, -8.0f, 8.0f, 3);
    const auto bias = random_vector(classes, -2.0f, 2.0f, 4);
    const auto labels = random_labels(rows, classes, 5);
    auto logits = raw; // what the separate kernels see
    if (with_bias)
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < classes; ++j) logits[static_cast<std::size_t>(r * classes + j)] += bias[static_cast<std::size_t>(j)];
    const auto want = cpu::cross_entropy_forward_ref(logits.data(), labels.data(), ignore, rows, classes);
    auto fused = raw;
    const auto got = cpu::cross_entropy_mean_grad(path, fused.data(), with_bias ? bias.data() : nullptr, labels.data(),
                                                  ignore, rows, classes);
    CHECK(got.count == want.count);
    CHECK(got.correct == want.correct);
    DSA_CHECK_CLOSE(&got.loss_sum, &want.loss_sum, 1, test::f32_kernel);
    const float scale = 1.0f / static_cast<float>(want.count);
    const auto d_ref = gradient_ref(logits, labels, scale, rows, classes);
    DSA_CHECK_CLOSE(fused.data(), d_ref.data(), rows * classes, test::f32_kernel);
    // The two-call path on the same logits agrees to within the rounding of the sums.
    std::vector<float> d(logits.size());
    cpu::cross_entropy_backward(path, d.data(), logits.data(), labels.data(), ignore, scale, rows, classes);
    const std::vector<double> d_wide(d.begin(), d.end());
    DSA_CHECK_CLOSE(fused.data(), d_wide.data(), rows * classes, test::f32_kernel);
  }
}

TEST_CASE("cross_entropy_mean_grad: rows all ignored give a zero gradient and no count") {
  std::vector<float> logits = {1.0f, 2.0f, 3.0f, -1.0f, 0.5f, 4.0f};
  const std::vector<std::int32_t> labels = {ignore, ignore};
  const auto got = cpu::cross_entropy_mean_grad(logits.data(), nullptr, labels.data(), ignore, 2, 3);
  CHECK(got.count == 0);
  CHECK(got.correct == 0);
  CHECK(got.loss_sum == 0.0);
  for (float v : logits) CHECK(v == 0.0f);
}

TEST_CASE("cross_entropy: accuracy counts the first maximum, wherever it lies in the row") {
  for (std::int64_t classes : {65, 128, 200}) {
  // (position of the maximum, a second equal maximum or -1, the label): correct when the
  // label is the first maximum.
  struct row_case {
    std::int64_t at, also;
    std::int32_t label;
    bool correct;
  };
  const row_case cases[] = {{0, -1, 0, true},     {63, -1, 63, true},  {64, -1, 64, true},  {65, -1, 65, true},
                            {199, -1, 199, true}, {150, 10, 150, false}, {150, 10, 10, true}, {128, 190, 128, true},
                            {5, -1, 6, false},    {127, -1, 127, true},  {64, 127, 127, false}};
  for (cpu::isa path : test::isa_paths())
  for (const auto& c : cases) {
    if (c.at >= classes || c.also >= classes || c.label >= classes)
      continue;
    CAPTURE(classes);
    CAPTURE(cpu::isa_name(path));
    CAPTURE(c.at);
    CAPTURE(c.also);
    std::vector<float> logits(static_cast<std::size_t>(classes), -1.0f);
    logits[static_cast<std::size_t>(c.at)] = 3.0f;
    if (c.also >= 0)
      logits[static_cast<std::size_t>(c.also)] = 3.0f;
    const auto got = cpu::cross_entropy_forward(path, logits.data(), &c.label, ignore, 1, classes);
    CHECK(got.correct == (c.correct ? 1 : 0));
    auto fused = logits;
    const auto got_fused = cpu::cross_entropy_mean_grad(path, fused.data(), nullptr, &c.label, ignore, 1, classes);
    CHECK(got_fused.correct == (c.correct ? 1 : 0));
  }
  // The maximum in the last slot, and a row of NaNs: no index compares equal to its
  // maximum, so the search ends on the last index (first_max's contract, which the CUDA
  // twin shares; the double reference keeps index 0 there, and no loss test feeds it NaNs).
  for (cpu::isa path : test::isa_paths()) {
    CAPTURE(classes);
    std::vector<float> last(static_cast<std::size_t>(classes), -1.0f);
    last.back() = 2.0f;
    const std::int32_t end_label = static_cast<std::int32_t>(classes - 1);
    CHECK(cpu::cross_entropy_forward(path, last.data(), &end_label, ignore, 1, classes).correct == 1);
    std::vector<float> nans(static_cast<std::size_t>(classes), std::nanf(""));
    CHECK(cpu::cross_entropy_forward(path, nans.data(), &end_label, ignore, 1, classes).correct == 1);
    auto nan_grad = nans;
    CHECK(cpu::cross_entropy_mean_grad(path, nan_grad.data(), nullptr, &end_label, ignore, 1, classes).correct == 1);
  }
  }
}
