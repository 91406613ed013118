// Dropout with masks drawn from Philox counters (core/philox.hpp): element i of
// a stream is kept iff stream.uniform(i) >= p. Kept values are scaled by 1/(1-p).
#pragma once

#include "core/philox.hpp"
#include "kernels/cpu/isa.hpp"

#include <cstdint>

namespace dsa::cpu {

// mask: (n) u8, 1 = kept, written when non-null. y may alias x. p in [0, 1).
void dropout_forward(float* y, std::uint8_t* mask, const float* x, float p, const philox_stream& stream,
                     std::int64_t n);
// Recomputes the mask of a stream (for recompute in backward).
void dropout_mask(std::uint8_t* mask, float p, const philox_stream& stream, std::int64_t n);
// dx = dy * mask / (1 - p) (overwrite); dx may alias dy.
void dropout_backward(float* dx, const float* dy, const std::uint8_t* mask, float p, std::int64_t n);
// y = dropout(x) + residual in one pass (the residual branch of a transformer layer): the
// same bits as dropout_forward then an add. y may alias x or residual.
void dropout_residual_forward(float* y, const float* x, const float* residual, float p, const philox_stream& stream,
                              std::int64_t n);

// The same on a given vector path (kernels/cpu/isa.hpp; at most the CPU's best): every path
// gives the same bits.
void dropout_forward(isa path, float* y, std::uint8_t* mask, const float* x, float p, const philox_stream& stream,
                     std::int64_t n);
void dropout_mask(isa path, std::uint8_t* mask, float p, const philox_stream& stream, std::int64_t n);
void dropout_backward(isa path, float* dx, const float* dy, const std::uint8_t* mask, float p, std::int64_t n);
void dropout_residual_forward(isa path, float* y, const float* x, const float* residual, float p,
                              const philox_stream& stream, std::int64_t n);
// Elements [begin, begin + n) of a stream on one thread (for kernels that fuse dropout into
// their own parallel loop over rows): y[k] = dropout of x[k] as element begin + k, the bits
// dropout_forward gives that element. y may alias x.
void dropout_range(isa path, float* y, const float* x, float p, const philox_stream& stream, std::int64_t begin,
                   std::int64_t n);
// A broken invariant naming `who` when n elements need more than a stream's 2^32 Philox
// blocks: for fused kernels to check before their parallel region.
void check_dropout_elements(std::int64_t n, const char* who);

} // namespace dsa::cpu
