// Whole-tensor conversions through kernels/cpu/convert.
#include "actors/train/config/precision.hpp"

#include "kernels/cpu/convert.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
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

void round_in_place(tensor& x, dtype type) {
  if (type == dtype::f32) return;
  DSA_CHECK(x.type() == dtype::f32 && x.is_contiguous(), "round_in_place of {}", x.describe());
  constexpr std::int64_t chunk = 1 << 16; // 128 KiB of half values at a time
  std::vector<std::uint16_t> half(static_cast<std::size_t>(std::min<std::int64_t>(chunk, x.numel())));
  float* p = x.data<float>();
  for (std::int64_t at = 0; at < x.numel(); at += chunk) {
    const std::int64_t n = std::min(chunk, x.numel() - at);
    cpu::cast(half.data(), type, p + at, dtype::f32, n);
    cpu::cast(p + at, dtype::f32, half.data(), type, n);
  }
}

tensor loss_scale_tensor(double scale) {
  tensor t = tensor::empty({1}, dtype::i64);
  std::memcpy(t.raw_data(), &scale, sizeof scale);
  return t;
}

expected<double> loss_scale_of(const tensor& t) {
  if (!t.defined() || t.type() != dtype::i64 || t.numel() != 1)
    return make_error(errc::protocol, "the loss scale is {}, expected one i64 element",
                      t.defined() ? t.describe() : "(none)");
  double scale = 0;
  std::memcpy(&scale, t.raw_data(), sizeof scale);
  if (!std::isfinite(scale) || scale <= 0) return make_error(errc::protocol, "loss scale {} is not finite and > 0", scale);
  return scale;
}

} // namespace dsa::train
