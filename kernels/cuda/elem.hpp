// Storage types the CUDA launchers dispatch on, without CUDA or fmt headers so that both
// g++ and nvcc include it. Half data is passed as raw 16-bit words (core/half.hpp layout).
#pragma once

#include <cstdint>

namespace dsa::cuda {

enum class elem : std::uint8_t { f32, f16, bf16 };

constexpr std::int64_t elem_size(elem e) {
  return e == elem::f32 ? 4 : 2;
}

} // namespace dsa::cuda
