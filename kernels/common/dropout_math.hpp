// Dropout per element from Philox counters (core/philox.hpp), shared by the CPU twin
// and the CUDA kernel, so a mask drawn on the GPU equals the CPU's bit for bit.
#pragma once

#include "core/philox.hpp"
#include "kernels/common/host_device.hpp"

namespace dsa::common {

// Element `base + k` of the Philox block `block` (elements 4 block .. 4 block + 3) is
// kept iff its uniform is >= p, as cpu::dropout_forward decides.
DSA_HD bool dropout_keep(const std::array<float, 4>& uniforms, int k, float p) {
  return uniforms[static_cast<std::size_t>(k)] >= p;
}

// The same decision for one element of a stream (element i lies in Philox block i / 4).
DSA_HD bool dropout_keep_element(const philox_stream& rng, std::uint64_t i, float p) {
  return dropout_keep(rng.uniform4(static_cast<std::uint32_t>(i >> 2)), static_cast<int>(i & 3u),
                      p);
}

// Kept values scaled by 1 / (1 - p); dropped ones are 0 by selection, so an inf in a
// dropped element does not become NaN.
DSA_HD float dropout_apply(float x, bool keep, float scale) {
  return keep ? x * scale : 0.0f;
}

} // namespace dsa::common
