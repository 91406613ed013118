// 1-bit compression with error feedback (1-bit Adam's compressed allreduce,
// io/net/compressed_allreduce.hpp): signs packed 8 to a byte, most significant bit first
// (numpy's packbits), a set bit meaning +1 and a clear one -1; zero counts as +1. One
// scale per call: the RMS of the compensated values. Each kernel takes the path to run
// (kernels/cpu/isa.hpp: the plain loops, or AVX2, which AVX-512 CPUs run too); the forms
// without one use active_isa(). Every path gives the same bits.
#pragma once

#include "kernels/cpu/isa.hpp"

#include <cstdint>

namespace dsa::cpu {

// The sum of squares as every 1-bit kernel and its reference define it: element i goes to
// double partial sum i mod 8, and the partial sums are added pairwise,
// ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)).
double onebit_sum_of_squares(isa path, const float* y, std::int64_t n);
double onebit_sum_of_squares(const float* y, std::int64_t n);

// Compresses x with error feedback, n a multiple of 8:
//   y = x + error;  scale = sqrt(sum y^2 / n) (as float);  bit i = (y_i >= 0);
//   error_i = y_i - scale * (y_i >= 0 ? 1 : -1)
// bits: n / 8 bytes. Returns scale. x may equal error.
float onebit_compress(isa path, const float* x, float* error, std::uint8_t* bits, std::int64_t n);
float onebit_compress(const float* x, float* error, std::uint8_t* bits, std::int64_t n);

// acc_i += scale * (bit i ? 1 : -1), n a multiple of 8.
void onebit_accumulate(isa path, const std::uint8_t* bits, float scale, float* acc, std::int64_t n);
void onebit_accumulate(const std::uint8_t* bits, float scale, float* acc, std::int64_t n);

// out_i = scale * (bit i ? 1 : -1), n a multiple of 8.
void onebit_expand(isa path, const std::uint8_t* bits, float scale, float* out, std::int64_t n);
void onebit_expand(const std::uint8_t* bits, float scale, float* out, std::int64_t n);

} // namespace dsa::cpu
