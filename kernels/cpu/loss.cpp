// Sparse softmax cross-entropy on CPU: max-subtracted exponentials summed in double,
// OpenMP over rows, per-row results added in row order so the loss is deterministic.
#include "kernels/cpu/loss.hpp"

#include "core/error.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace dsa::cpu {
namespace {

constexpr std::int64_t parallel_threshold = 1 << 14;

// exp(x) for x <= 0, branch-free so `omp simd` loops vectorize it; ~1 ulp. Same scheme
// as the one in softmax.cpp: x = n ln2 + r, degree-7 Taylor for exp(r), 2^n in the
// exponent bits; results below ~2^-126.5 (x < -87.7) are exactly 0.
inline float exp_nonpositive(float x) {
  // Clamp to >= -88 by an unsigned min of the bits (for negative floats the pattern
  // grows with magnitude): a float compare is a possible trap that stops GCC's
  // if-conversion, and so vectorization, under the default -ftrapping-math.
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u = u < 0xC2B00000u ? u : 0xC2B00000u; // -88.0f
  std::memcpy(&x, &u, sizeof x);
  // Round to nearest by the 1.5 * 2^23 trick (|x log2 e| < 2^22); nearbyint is a call.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

void check_label(std::int32_t label, std::int64_t row, std::int64_t classes) {
  DSA_CHECK(label >= 0 && label < classes,
            "cross_entropy: labels[{}]={} outside [0, {}) and not ignored", row, label, classes);
}

void check_sizes(std::int64_t rows, std::int64_t classes) {
  DSA_CHECK(rows >= 0 && classes > 0, "cross_entropy: bad sizes rows={} classes={}", rows, classes);
}

float row_max(const float* x, std::int64_t classes) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (std::int64_t j = 0; j < classes; ++j)
    mx = x[j] > mx ? x[j] : mx;
  return mx;
}

double row_sum_exp(const float* x, float mx, std::int64_t classes) {
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t j = 0; j < classes; ++j)
    sum += static_cast<double>(exp_nonpositive(x[j] - mx));
  return sum;
}

// d = exp(x - mx) * inv; element-wise read then write, so d may alias x.
void row_scaled_exp(float* d, const float* x, float mx, float inv, std::int64_t classes) {
#pragma omp simd
  for (std::int64_t j = 0; j < classes; ++j)
    d[j] = exp_nonpositive(x[j] - mx) * inv;
}

} // namespace

xent_sum cross_entropy_forward(const float* logits, const std::int32_t* labels,
                               std::int32_t ignore_index, std::int64_t rows, std::int64_t classes) {
  check_sizes(rows, classes);
  std::vector<double> row_loss(static_cast<std::size_t>(rows), 0.0);
  std::vector<std::uint8_t> row_correct(static_cast<std::size_t>(rows), 0);
#pragma omp parallel for schedule(dynamic, 4) if (rows * classes >= parallel_threshold)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t label = labels[r];
    if (label == ignore_index)
      continue;
    check_label(label, r, classes);
    const float* x = logits + r * classes;
    const float mx = row_max(x, classes);
    const double sum = row_sum_exp(x, mx, classes);
    row_loss[static_cast<std::size_t>(r)] =
        std::log(sum) + static_cast<double>(mx) - static_cast<double>(x[label]);
    std::int64_t argmax = 0;
    while (argmax + 1 < classes && x[argmax] != mx)
      ++argmax; // first maximum, as the reference
    row_correct[static_cast<std::size_t>(r)] = argmax == label ? 1 : 0;
  }
  xent_sum out;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (labels[r] == ignore_index)
      continue;
    out.loss_sum += row_loss[static_cast<std::size_t>(r)];
    ++out.count;
    out.correct += row_correct[static_cast<std::size_t>(r)];
  }
  return out;
}

void cross_entropy_backward(float* dlogits, const float* logits, const std::int32_t* labels,
                            std::int32_t ignore_index, float scale, std::int64_t rows,
                            std::int64_t classes) {
  check_sizes(rows, classes);
#pragma omp parallel for schedule(dynamic, 4) if (rows * classes >= parallel_threshold)
  for (std::int64_t r = 0; r < rows; ++r) {
    float* d = dlogits + r * classes;
    const std::int32_t label = labels[r];
    if (label == ignore_index) {
      std::memset(d, 0, static_cast<std::size_t>(classes) * sizeof(float));
      continue;
    }
    check_label(label, r, classes);
    const float* x = logits + r * classes;
    const float mx = row_max(x, classes);
    const float inv = static_cast<float>(static_cast<double>(scale) / row_sum_exp(x, mx, classes));
    row_scaled_exp(d, x, mx, inv, classes);
    d[label] -= scale;
  }
}

xent_sum cross_entropy_forward_ref(const float* logits, const std::int32_t* labels,
                                   std::int32_t ignore_index, std::int64_t rows,
                                   std::int64_t classes) {
  check_sizes(rows, classes);
  xent_sum out;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t label = labels[r];
    if (label == ignore_index)
      continue;
    check_label(label, r, classes);
    const float* x = logits + r * classes;
    std::int64_t argmax = 0;
    for (std::int64_t j = 1; j < classes; ++j)
      if (x[j] > x[argmax])
        argmax = j;
    const double mx = x[argmax];
    double sum = 0.0;
    for (std::int64_t j = 0; j < classes; ++j)
      sum += std::exp(static_cast<double>(x[j]) - mx);
    out.loss_sum += std::log(sum) + mx - static_cast<double>(x[label]);
    ++out.count;
    if (argmax == label)
      ++out.correct;
  }
  return out;
}

} // namespace dsa::cpu
