// The storage types and awkward shapes the kernel tests run every kernel at (test_gpu_kernels.cpp,
// test_gpu_column_sums.cpp).
#pragma once

#include "kernels/cuda/elem.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "tests/gpu/gpu_test_util.hpp"

namespace dsa::test {

inline constexpr cuda::elem all_types[] = {cuda::elem::f32, cuda::elem::f16, cuda::elem::bf16};
struct shape {
  std::int64_t rows, c;
};
// 1, primes, and sizes off the warp and block widths; and rows of BERT-large's 1024, where
// the kernels take their 8-wide vector and register paths.
inline constexpr shape awkward[] = {{1, 1}, {3, 7}, {17, 769}, {5, 1031}, {2, 4099}, {9, 1024}};

// Runs fn(type, shape) for every storage type and awkward shape, naming both on failure.
template <class Fn> void for_each_case(Fn fn) {
  for (auto type : all_types) {
    for (auto s : awkward) {
      INFO(std::string(test::elem_name(type)) << " rows=" << s.rows << " c=" << s.c);
      fn(type, s);
    }
  }
}

inline std::size_t bytes_of(std::int64_t n, cuda::elem type) {
  return static_cast<std::size_t>(n * cuda::elem_size(type));
}

} // namespace dsa::test
