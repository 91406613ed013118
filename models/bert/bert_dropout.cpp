// Dropout apply and mask-regenerating backward.
#include "models/bert/bert_dropout.hpp"

#include "kernels/cpu/dropout.hpp"

#include <cstring>
#include <vector>

namespace dsa::bert {

void dropout_apply(float* y, const float* x, float p, const philox_stream& stream, std::int64_t n) {
  if (p > 0.0f) {
    cpu::dropout_forward(y, nullptr, x, p, stream, n);
  } else if (y != x) {
    std::memcpy(y, x, static_cast<std::size_t>(n) * sizeof(float));
  }
}

void dropout_apply_backward(float* dx, const float* dy, float p, const philox_stream& stream,
                            std::int64_t n) {
  if (p > 0.0f) {
    std::vector<std::uint8_t> mask(static_cast<std::size_t>(n));
    cpu::dropout_mask(mask.data(), p, stream, n);
    cpu::dropout_backward(dx, dy, mask.data(), p, n);
  } else if (dx != dy) {
    std::memcpy(dx, dy, static_cast<std::size_t>(n) * sizeof(float));
  }
}

} // namespace dsa::bert
