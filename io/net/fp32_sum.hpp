// fp32 accumulation of f32/f16/bf16 buffers, the arithmetic of every reduction in io/net.
#pragma once

#include "core/dtype.hpp"

#include <cstdint>
#include <vector>

namespace dsa::net {

// out: (n) f32 = in: (n) of `type` (f32, f16 or bf16), exactly.
void widen_to_f32(float* out, const void* in, dtype type, std::int64_t n);
// acc: (n) f32 += in: (n) of `type`, element by element, in fp32. scratch: reused
// storage for the widened input (resized as needed).
void add_to_f32(float* acc, const void* in, dtype type, std::int64_t n,
                std::vector<float>& scratch);
// out: (n) f32 = a: (n) f32 + b: (n) of `type`, element by element, in fp32 (the same
// bits as copying a into out and add_to_f32(out, b)). out may be a, or b when b is f32.
// scratch: reused storage for the widened b.
void sum_to_f32(float* out, const float* a, const void* b, dtype type, std::int64_t n,
                std::vector<float>& scratch);
// out: (n) of `type` = in: (n) f32 rounded to nearest even.
void narrow_from_f32(void* out, dtype type, const float* in, std::int64_t n);

} // namespace dsa::net
