// Buffer conversion between f32 and f16/bf16 (round to nearest even), and
// inf/nan detection for the loss scaler.
#pragma once

#include "core/dtype.hpp"
#include "kernels/cpu/isa.hpp"

#include <cstdint>

namespace dsa::cpu {

void cast_f32_to_f16(std::uint16_t* out, const float* in, std::int64_t n);
void cast_f16_to_f32(float* out, const std::uint16_t* in, std::int64_t n);
void cast_f32_to_bf16(std::uint16_t* out, const float* in, std::int64_t n);
void cast_bf16_to_f32(float* out, const std::uint16_t* in, std::int64_t n);
// Any of f32/f16/bf16 to any of them; same type is a copy.
void cast(void* out, dtype out_type, const void* in, dtype in_type, std::int64_t n);

// True when any element is +-inf or NaN. in_type: f32, f16 or bf16.
bool has_inf_or_nan(const void* in, dtype in_type, std::int64_t n);

// The same on a given vector path (kernels/cpu/isa.hpp; at most the CPU's best). Every path
// gives core/half.hpp's bits; the ones above use active_isa().
void cast(isa path, void* out, dtype out_type, const void* in, dtype in_type, std::int64_t n);
bool has_inf_or_nan(isa path, const void* in, dtype in_type, std::int64_t n);

// Whether the AVX-512 path rounds f32 to bf16 with the CPU's AVX512_BF16 instruction
// (vcvtne2ps2bf16, the same bits: vectors holding a subnormal take the integer rounding) rather
// than integer operations. On where the CPU has AVX512_BF16; tests and benchmarks turn it
// off to compare (false is refused nowhere; true where the CPU lacks it is a broken invariant).
bool bf16_conversion_instructions();
void use_bf16_conversion_instructions(bool on);

} // namespace dsa::cpu
