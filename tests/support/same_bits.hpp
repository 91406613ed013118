// Bit-for-bit equality of two buffers: unlike ==, it tells -0.0 from +0.0 and holds for
// NaNs with the same payload, which "the same bits" claims need.
#pragma once

#include <cstring>
#include <vector>

namespace dsa::test {

template <class T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

} // namespace dsa::test
