// Bias add and bias-gradient reduction over rows.
#pragma once

#include "core/dtype.hpp"
#include "kernels/cpu/isa.hpp"

#include <cstdint>

namespace dsa::cpu {

// y: (rows, c) += bias: (c), in place.
void bias_add(float* y, const float* bias, std::int64_t rows, std::int64_t c);
// dbias: (c) += sum over rows of dy: (rows, c).
void bias_backward(float* dbias, const float* dy, std::int64_t rows, std::int64_t c);

// The two on a given path (at most the CPU's best); every path gives the same bits.
void bias_add(isa path, float* y, const float* bias, std::int64_t rows, std::int64_t c);
void bias_backward(isa path, float* dbias, const float* dy, std::int64_t rows, std::int64_t c);

// out = half(y + bias) row by row, y left as it is: bias_add then a cast to f16 or bf16
// in one pass, with their bits. For projections whose only reader takes the half values.
// y's rows are y_ld apart (0: c, packed; else at least c: a column block of a wider product);
// out is packed (rows, c).
void bias_add_rounded(isa path, std::uint16_t* out, dtype half, const float* y, const float* bias, std::int64_t rows,
                      std::int64_t c, std::int64_t y_ld = 0);
// bias_backward that also writes dy rounded to bf16 (nearest even, cast's bits) to dy_bf16,
// in the same pass: for a linear's backward whose products read the gradient in bf16.
// dy_bf16 must not overlap dy.
void bias_backward_rounded(isa path, float* dbias, std::uint16_t* dy_bf16, const float* dy, std::int64_t rows,
                           std::int64_t c);
void bias_backward_ref(float* dbias, const float* dy, std::int64_t rows, std::int64_t c);

} // namespace dsa::cpu
