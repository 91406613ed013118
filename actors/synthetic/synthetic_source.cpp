// Synthetic micro-batches; see synthetic_source.hpp.
#include "actors/synthetic/synthetic_source.hpp"

#include <cmath>

namespace dsa::actors {

void synthetic_source::fill(std::uint32_t step, std::uint32_t micro_batch, tensor& input, tensor& labels) {
  if (!input.defined()) input = tensor::empty({rows_, width_}, dtype::f32);
  if (!labels.defined()) labels = tensor::empty({rows_, width_}, dtype::f32);
  float* x = input.data<float>();
  float* t = labels.data<float>();
  const double base = 1.3 * step + 0.37 * (micro_batch + offset_);
  for (std::int64_t r = 0; r < rows_; ++r)
    for (std::int64_t c = 0; c < width_; ++c) {
      x[r * width_ + c] = static_cast<float>(std::cos(base + 0.5 * r + 0.23 * c));
      t[r * width_ + c] = static_cast<float>(0.5 * std::sin(base + 0.11 * r - 0.29 * c));
    }
}

} // namespace dsa::actors
