// Sparse softmax cross-entropy on CPU: max-subtracted exponentials summed in double,
// OpenMP over rows, per-row results added in row order so the loss is deterministic.
#include "kernels/cpu/loss.hpp"

#include "core/error.hpp"
#include "kernels/cpu/vec_math.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace dsa::cpu {
namespace {

constexpr std::int64_t parallel_threshold = 1 << 14;

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
    sum += static_cast<double>(vec::exp_nonpositive(x[j] - mx));
  return sum;
}

// d = exp(x - mx) * inv; element-wise read then write, so d may alias x.
void row_scaled_exp(float* d, const float* x, float mx, float inv, std::int64_t classes) {
#pragma omp simd
  for (std::int64_t j = 0; j < classes; ++j)
    d[j] = vec::exp_nonpositive(x[j] - mx) * inv;
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
