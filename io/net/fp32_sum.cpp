// fp32 accumulation through the kernels' vectorized f16/bf16 casts.
#include "io/net/fp32_sum.hpp"

#include "kernels/cpu/convert.hpp"

namespace dsa::net {

void widen_to_f32(float* out, const void* in, dtype type, std::int64_t n) {
  if (n > 0)
    cpu::cast(out, dtype::f32, in, type, n);
}

void add_to_f32(float* acc, const void* in, dtype type, std::int64_t n,
                std::vector<float>& scratch) {
  const float* x = static_cast<const float*>(in);
  if (type != dtype::f32) {
    scratch.resize(static_cast<std::size_t>(n));
    widen_to_f32(scratch.data(), in, type, n);
    x = scratch.data();
  }
  for (std::int64_t i = 0; i < n; ++i)
    acc[i] += x[i];
}

void sum_to_f32(float* out, const float* a, const void* b, dtype type, std::int64_t n,
                std::vector<float>& scratch) {
  const float* y = static_cast<const float*>(b);
  if (type != dtype::f32) {
    if (scratch.size() < static_cast<std::size_t>(n))
      scratch.resize(static_cast<std::size_t>(n));
    widen_to_f32(scratch.data(), b, type, n);
    y = scratch.data();
  }
  for (std::int64_t i = 0; i < n; ++i)
    out[i] = a[i] + y[i];
}

void narrow_from_f32(void* out, dtype type, const float* in, std::int64_t n) {
  if (n > 0)
    cpu::cast(out, type, in, dtype::f32, n);
}

} // namespace dsa::net
