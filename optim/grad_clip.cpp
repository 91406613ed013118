// Gradient norms in double and DeepSpeed's combined unscale + clip factor.
#include "optim/grad_clip.hpp"

#include "core/file_backed.hpp"
#include "core/half.hpp"

#include <algorithm>

#include <cmath>

namespace dsa::optim {
namespace {

// Squares of elements [from, to) added into four independent accumulators (vectorizable,
// less serial rounding than one), element i into acc[i % 4]; a window that starts at a
// multiple of 4 continues a sweep exactly as one pass would.
template <class Load> void add_squares(double (&acc)[4], std::int64_t from, std::int64_t to, Load load) {
  std::int64_t i = from;
  for (; i + 4 <= to; i += 4)
    for (int j = 0; j < 4; ++j) {
      double x = load(i + j);
      acc[j] += x * x;
    }
  for (; i < to; ++i) {
    double x = load(i);
    acc[0] += x * x;
  }
}

template <class Load> double squares(std::int64_t n, Load load) {
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  add_squares(acc, 0, n, load);
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

} // namespace

double sum_of_squares(const void* x, dtype type, std::int64_t n) {
  switch (type) {
  case dtype::f32: {
    const float* p = static_cast<const float*>(x);
    return squares(n, [p](std::int64_t i) { return static_cast<double>(p[i]); });
  }
  case dtype::f16: {
    const std::uint16_t* p = static_cast<const std::uint16_t*>(x);
    return squares(n, [p](std::int64_t i) { return static_cast<double>(f16_to_f32(p[i])); });
  }
  case dtype::bf16: {
    const std::uint16_t* p = static_cast<const std::uint16_t*>(x);
    return squares(n, [p](std::int64_t i) { return static_cast<double>(bf16_to_f32(p[i])); });
  }
  default: DSA_CHECK(false, "sum_of_squares: {} is not a floating type", dtype_name(type));
  }
  return 0.0;
}

double sum_of_squares(const tensor& x) {
  DSA_CHECK(x.is_contiguous() && x.dev().is_cpu(), "sum_of_squares needs a contiguous CPU tensor, got {}",
            x.describe());
  if (x.type() != dtype::f32 || !is_file_backed(x)) return sum_of_squares(x.raw_data(), x.type(), x.numel());
  // In a file (file_backed.hpp): a window at a time, each paged out after it is read; the
  // windows are multiples of 4 elements, so the sum is the one pass's, bit for bit.
  const float* p = x.data<float>();
  const auto load = [p](std::int64_t i) { return static_cast<double>(p[i]); };
  const std::int64_t window = file_backed_window_bytes() / static_cast<std::int64_t>(sizeof(float)); // pages: a multiple of 4
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  for (std::int64_t lo = 0; lo < x.numel(); lo += window) {
    const std::int64_t hi = std::min(x.numel(), lo + window);
    add_squares(acc, lo, hi, load);
    page_out(p + lo, static_cast<std::size_t>(hi - lo) * sizeof(float));
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

double grad_norm::norm() const { return std::sqrt(sum_); }
bool grad_norm::finite() const { return std::isfinite(sum_); }

double combined_unscale_clip(double scaled_norm, double loss_scale, double clip_grad) {
  double combined = loss_scale;
  if (clip_grad > 0.0) {
    double clip = (scaled_norm / loss_scale + 1e-6) / clip_grad;
    if (clip > 1.0) combined = clip * loss_scale;
  }
  return combined;
}

void scale_in_place(float* x, double factor, std::int64_t n) {
  const float f = static_cast<float>(factor);
  for (std::int64_t i = 0; i < n; ++i) x[i] *= f;
}

void scale_in_place(tensor& x, double factor) {
  DSA_CHECK(x.is_contiguous() && x.dev().is_cpu(), "scale_in_place needs a contiguous CPU tensor, got {}",
            x.describe());
  scale_in_place(x.data<float>(), factor, x.numel());
}

} // namespace dsa::optim
