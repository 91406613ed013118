// Dropout apply and mask-regenerating backward.
#include "models/bert/bert_dropout.hpp"

#include "kernels/cpu/dropout.hpp"

#include <cstring>

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
  // The forward's mask and scale, regenerated from the stream: applying dropout to dy is
  // its gradient (the same bits as dropout_mask then dropout_backward, with no mask).
  dropout_apply(dx, dy, p, stream, n);
}

} // namespace dsa::bert
