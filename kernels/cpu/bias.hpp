// Bias add and bias-gradient reduction over rows.
#pragma once

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

void bias_backward_ref(float* dbias, const float* dy, std::int64_t rows, std::int64_t c);

} // namespace dsa::cpu
