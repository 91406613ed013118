// Sparse softmax cross-entropy on CPU: max-subtracted exponentials summed in double,
// OpenMP over rows, per-row results added in row order so the loss is deterministic. The
// row loops (loss_rows.inc) are compiled for the build's target and for AVX-512 (16-lane
// vectors), chosen by active_isa().
#include "kernels/cpu/loss.hpp"

#include "core/error.hpp"
#include "kernels/cpu/isa.hpp"
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

// The row loops of each path, and the set a call uses.
struct row_loops {
  float (*max)(const float* x, std::int64_t classes);
  double (*sum_exp)(const float* x, float mx, std::int64_t classes);
  void (*scaled_exp)(float* d, const float* x, float mx, float inv, std::int64_t classes);
  float (*bias_max)(float* x, const float* bias, std::int64_t classes);
  double (*store_exp)(float* x, float mx, std::int64_t classes);
  void (*scale)(float* x, float s, std::int64_t classes);
};

// The first index holding the row's maximum, as the reference takes it (the last index when
// none does, as with a NaN). Blocks without it are skipped with a vector compare.
std::int64_t first_max(const float* x, float mx, std::int64_t classes) {
  constexpr std::int64_t block = 64;
  std::int64_t argmax = 0;
  for (; argmax + block < classes; argmax += block) {
    int hit = 0;
#pragma omp simd reduction(| : hit)
    for (std::int64_t j = 0; j < block; ++j) hit |= x[argmax + j] == mx ? 1 : 0;
    if (hit != 0)
      break;
  }
  while (argmax + 1 < classes && x[argmax] != mx)
    ++argmax;
  return argmax;
}

} // namespace

namespace loss_base {
#include "kernels/cpu/loss_rows.inc"
} // namespace loss_base

DSA_AVX512_REGION_BEGIN
namespace loss_avx512 {
#include "kernels/cpu/loss_rows.inc"
} // namespace loss_avx512
DSA_AVX512_REGION_END

namespace {

row_loops loops_for(isa path) {
  check_path(path, "cross_entropy");
  if (path == isa::avx512)
    return {loss_avx512::row_max,      loss_avx512::row_sum_exp,   loss_avx512::row_scaled_exp,
            loss_avx512::row_bias_max, loss_avx512::row_store_exp, loss_avx512::row_scale};
  return {loss_base::row_max,      loss_base::row_sum_exp,   loss_base::row_scaled_exp,
          loss_base::row_bias_max, loss_base::row_store_exp, loss_base::row_scale};
}

// The per-row results added in row order (so the loss does not depend on the threads).
struct row_results {
  std::vector<double> loss;
  std::vector<std::uint8_t> correct;
  explicit row_results(std::int64_t rows)
      : loss(static_cast<std::size_t>(rows), 0.0), correct(static_cast<std::size_t>(rows), 0) {}
  xent_sum total(const std::int32_t* labels, std::int32_t ignore_index) const {
    xent_sum out;
    for (std::size_t r = 0; r < loss.size(); ++r) {
      if (labels[r] == ignore_index)
        continue;
      out.loss_sum += loss[r];
      ++out.count;
      out.correct += correct[r];
    }
    return out;
  }
};

} // namespace

xent_sum cross_entropy_forward(isa path, const float* logits, const std::int32_t* labels,
                               std::int32_t ignore_index, std::int64_t rows, std::int64_t classes) {
  check_sizes(rows, classes);
  const row_loops f = loops_for(path);
  row_results rows_out(rows);
#pragma omp parallel for schedule(dynamic, 4) if (rows * classes >= parallel_threshold)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t label = labels[r];
    if (label == ignore_index)
      continue;
    check_label(label, r, classes);
    const float* x = logits + r * classes;
    const float mx = f.max(x, classes);
    const double sum = f.sum_exp(x, mx, classes);
    rows_out.loss[static_cast<std::size_t>(r)] =
        std::log(sum) + static_cast<double>(mx) - static_cast<double>(x[label]);
    rows_out.correct[static_cast<std::size_t>(r)] = first_max(x, mx, classes) == label ? 1 : 0;
  }
  return rows_out.total(labels, ignore_index);
}

void cross_entropy_backward(isa path, float* dlogits, const float* logits, const std::int32_t* labels,
                            std::int32_t ignore_index, float scale, std::int64_t rows,
                            std::int64_t classes) {
  check_sizes(rows, classes);
  const row_loops f = loops_for(path);
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
    const float mx = f.max(x, classes);
    const float inv = static_cast<float>(static_cast<double>(scale) / f.sum_exp(x, mx, classes));
    f.scaled_exp(d, x, mx, inv, classes);
    d[label] -= scale;
  }
}

xent_sum cross_entropy_mean_grad(isa path, float* logits, const float* bias, const std::int32_t* labels,
                                 std::int32_t ignore_index, std::int64_t rows, std::int64_t classes) {
  check_sizes(rows, classes);
  const row_loops f = loops_for(path);
  std::int64_t count = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (labels[r] != ignore_index) {
      check_label(labels[r], r, classes);
      ++count;
    }
  }
  const float scale = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
  row_results rows_out(rows);
#pragma omp parallel for schedule(dynamic, 4) if (rows * classes >= parallel_threshold)
  for (std::int64_t r = 0; r < rows; ++r) {
    float* x = logits + r * classes;
    const std::int32_t label = labels[r];
    if (label == ignore_index) {
      std::memset(x, 0, static_cast<std::size_t>(classes) * sizeof(float));
      continue;
    }
    const float mx = f.bias_max(x, bias, classes);
    const float target = x[label];
    rows_out.correct[static_cast<std::size_t>(r)] = first_max(x, mx, classes) == label ? 1 : 0;
    const double sum = f.store_exp(x, mx, classes);
    rows_out.loss[static_cast<std::size_t>(r)] = std::log(sum) + static_cast<double>(mx) - static_cast<double>(target);
    f.scale(x, static_cast<float>(static_cast<double>(scale) / sum), classes);
    x[label] -= scale;
  }
  return rows_out.total(labels, ignore_index);
}

xent_sum cross_entropy_mean_grad(float* logits, const float* bias, const std::int32_t* labels,
                                 std::int32_t ignore_index, std::int64_t rows, std::int64_t classes) {
  return cross_entropy_mean_grad(active_isa(), logits, bias, labels, ignore_index, rows, classes);
}

xent_sum cross_entropy_forward(const float* logits, const std::int32_t* labels, std::int32_t ignore_index,
                               std::int64_t rows, std::int64_t classes) {
  return cross_entropy_forward(active_isa(), logits, labels, ignore_index, rows, classes);
}

void cross_entropy_backward(float* dlogits, const float* logits, const std::int32_t* labels,
                            std::int32_t ignore_index, float scale, std::int64_t rows, std::int64_t classes) {
  cross_entropy_backward(active_isa(), dlogits, logits, labels, ignore_index, scale, rows, classes);
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
