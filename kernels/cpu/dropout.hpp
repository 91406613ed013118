// Dropout with masks drawn from Philox counters (core/philox.hpp): element i of
// a stream is kept iff stream.uniform(i) >= p. Kept values are scaled by 1/(1-p).
#pragma once

#include "core/philox.hpp"

#include <cstdint>

namespace dsa::cpu {

// mask: (n) u8, 1 = kept, written when non-null. y may alias x. p in [0, 1).
void dropout_forward(float* y, std::uint8_t* mask, const float* x, float p, const philox_stream& stream,
                     std::int64_t n);
// Recomputes the mask of a stream (for recompute in backward).
void dropout_mask(std::uint8_t* mask, float p, const philox_stream& stream, std::int64_t n);
// dx = dy * mask / (1 - p) (overwrite); dx may alias dy.
void dropout_backward(float* dx, const float* dy, const std::uint8_t* mask, float p, std::int64_t n);

} // namespace dsa::cpu
