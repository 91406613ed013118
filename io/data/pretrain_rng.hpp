// The random source of pre-training data preparation: std::mt19937_64 (its
// output sequence is fixed by the C++ standard) with our own uniform integer,
// uniform real and shuffle, because std's distributions and std::shuffle are
// implementation-defined. Same seed, same data, on every standard library.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace dsa::data {

// SplitMix64 finaliser: derives independent seeds from (seed, stream ids).
constexpr std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
constexpr std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0) {
  return mix64(mix64(mix64(seed) ^ a) ^ b);
}

class prep_rng {
public:
  explicit prep_rng(std::uint64_t seed) : engine_(seed) {}

  std::uint64_t next_u64() { return engine_(); }

  // Uniform integer in [lo, hi] (inclusive) by rejection: no modulo bias.
  std::int64_t uniform_int(std::int64_t lo, std::int64_t hi) {
    if (hi <= lo)
      return lo;
    std::uint64_t span = static_cast<std::uint64_t>(hi - lo) + 1; // 0 means the full 2^64 range
    if (span == 0)
      return static_cast<std::int64_t>(next_u64());
    std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % span + 1) % span;
    std::uint64_t x;
    do {
      x = next_u64();
    } while (x > limit);
    return lo + static_cast<std::int64_t>(x % span);
  }

  // Uniform real in [0, 1) with 53 random bits.
  double uniform_real() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  // Fisher-Yates from the back, as Python's random.shuffle.
  template <class T> void shuffle(std::vector<T>& v) {
    for (std::size_t i = v.size(); i > 1; --i) {
      auto j = static_cast<std::size_t>(uniform_int(0, static_cast<std::int64_t>(i - 1)));
      std::swap(v[i - 1], v[j]);
    }
  }

private:
  std::mt19937_64 engine_;
};

} // namespace dsa::data
