// Working precision of a run (fp16.enabled / bf16.enabled) and conversions of
// whole tensors between it and f32.
#pragma once

#include "core/error.hpp"
#include "core/tensor.hpp"

#include <cstdint>

namespace dsa::train {

// f32: everything in f32. f16 / bf16: the stages' working weights and stashed
// activations, activations and activation-gradients between stages and
// parameter versions from the optimizer are half precision; parameter gradients
// are rounded to it when published to the reducer; masters, gradient
// accumulation and compute stay f32 (CPU ranks compute in f32).
enum class precision : std::uint8_t { f32, f16, bf16 };

inline dtype working_dtype(precision p) {
  return p == precision::f16 ? dtype::f16 : p == precision::bf16 ? dtype::bf16 : dtype::f32;
}
const char* precision_name(precision p);

// A contiguous copy of `src` (f32/f16/bf16) as `type`; reuses `dst` when its shape and type fit.
void cast_into(tensor& dst, const tensor& src, dtype type);
tensor cast_to(const tensor& src, dtype type);
// The loss scale carried as the last tensor of a parameter version: the
// double's bits in an i64 tensor of one element (exact for any scale).
tensor loss_scale_tensor(double scale);
// Reads it back; an error when `t` is not such a tensor or the scale is not finite and > 0.
expected<double> loss_scale_of(const tensor& t);

// Rounds every element of x (f32, contiguous) to the nearest value of `type`
// (f16 or bf16, round to nearest even), in place; f32 leaves x as it is.
void round_in_place(tensor& x, dtype type);

} // namespace dsa::train
