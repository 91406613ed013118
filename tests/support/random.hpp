// Seeded random test inputs.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace dsa::test {

// n floats uniform in [lo, hi), fixed by `seed`.
inline std::vector<float> random_vector(std::int64_t n, float lo, float hi, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& e : v) e = dist(gen);
  return v;
}

} // namespace dsa::test
