// Whole-tensor conversions through kernels/cpu/convert.
#include "actors/train/precision.hpp"

#include "kernels/cpu/convert.hpp"

#include <vector>

namespace dsa::train {

const char* precision_name(precision p) {
  switch (p) {
  case precision::f32: return "fp32";
  case precision::f16: return "fp16 (fp32 master weights)";
  case precision::bf16: return "bf16 (fp32 master weights)";
  }
  return "?";
}

void cast_into(tensor& dst, const tensor& src, dtype type) {
  DSA_CHECK(src.is_contiguous(), "cast of a non-contiguous tensor {}", src.describe());
  if (!dst.defined() || dst.type() != type || dst.shape() != src.shape()) dst = tensor::empty(src.shape(), type);
  cpu::cast(dst.raw_data(), type, src.raw_data(), src.type(), src.numel());
}

tensor cast_to(const tensor& src, dtype type) {
  tensor out;
  cast_into(out, src, type);
  return out;
}

} // namespace dsa::train
