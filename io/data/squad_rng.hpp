// A small deterministic generator (splitmix64) for SQuAD data generation and
// baselines: the same seed gives the same stream on every platform (unlike
// std:: distributions, whose algorithms are implementation-defined).
#pragma once

#include <cstdint>
#include <string_view>

namespace dsa::data {

class squad_rng {
public:
  explicit squad_rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) for n >= 1 (modulo bias below 2^-40 for the sizes used here).
  std::uint64_t below(std::uint64_t n) { return next() % n; }

private:
  std::uint64_t state_;
};

// FNV-1a of a string, to derive per-item seeds that do not depend on order.
inline std::uint64_t squad_hash(std::string_view text, std::uint64_t seed = 0xCBF29CE484222325ull) {
  std::uint64_t h = seed;
  for (unsigned char c : text)
    h = (h ^ c) * 0x100000001B3ull;
  return h;
}

} // namespace dsa::data
