// Element types of tensors and their sizes and names.
#pragma once

#include "core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace dsa {

enum class dtype : std::uint8_t { f32, f16, bf16, i32, i64, u8 };

constexpr std::size_t dtype_size(dtype t) {
  switch (t) {
  case dtype::f32: return 4;
  case dtype::f16: return 2;
  case dtype::bf16: return 2;
  case dtype::i32: return 4;
  case dtype::i64: return 8;
  case dtype::u8: return 1;
  }
  return 0;
}

constexpr bool dtype_is_float(dtype t) { return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16; }

// "f32", "f16", "bf16", "i32", "i64", "u8".
const char* dtype_name(dtype t);
// Accepts our names and the usual aliases ("fp32", "float16", "bfloat16", ...).
expected<dtype> parse_dtype(std::string_view name);

// Maps a C++ element type to its dtype (for typed data access checks).
template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr dtype value = dtype::f32; };
template <> struct dtype_of<std::int32_t> { static constexpr dtype value = dtype::i32; };
template <> struct dtype_of<std::int64_t> { static constexpr dtype value = dtype::i64; };
template <> struct dtype_of<std::uint8_t> { static constexpr dtype value = dtype::u8; };

} // namespace dsa
