// Philox4x32-10 counter-based RNG (Salmon et al., SC'11). A dropout mask is a
// pure function of (seed, step, micro-batch, layer, site, element), so a mask
// recomputed in backward, on another rank or on the GPU equals the original.
#pragma once

#include <array>
#include <cstdint>

namespace dsa {

using philox_counter = std::array<std::uint32_t, 4>;
using philox_key = std::array<std::uint32_t, 2>;

// Ten rounds of Philox4x32 on `counter` under `key`: four independent 32-bit words.
constexpr philox_counter philox4x32(philox_counter c, philox_key k) {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    std::uint64_t p0 = static_cast<std::uint64_t>(m0) * c[0];
    std::uint64_t p1 = static_cast<std::uint64_t>(m1) * c[2];
    std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += w0;
    k[1] += w1;
  }
  return c;
}

// Which random stream: one per (seed, step, micro-batch, layer, site). `site`
// tells apart the dropouts inside one layer (attention probabilities, attention
// output, FFN output, embeddings) and must be < 256.
struct philox_stream {
  std::uint64_t seed = 0;
  std::uint32_t step = 0;
  std::uint32_t micro_batch = 0;
  std::uint32_t layer = 0;
  std::uint32_t site = 0;

  // constexpr so that CUDA kernels call the same functions (nvcc --expt-relaxed-constexpr).
  constexpr philox_key key() const {
    return {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
  }
  // Counter of the block holding elements [4*block, 4*block+4).
  constexpr philox_counter counter(std::uint32_t block) const {
    return {block, step, micro_batch, (layer << 8) | (site & 0xffu)};
  }
  // Four uniforms in [0, 1) for elements 4*block .. 4*block+3 (24-bit resolution).
  constexpr std::array<float, 4> uniform4(std::uint32_t block) const {
    philox_counter r = philox4x32(counter(block), key());
    std::array<float, 4> out{};
    for (int i = 0; i < 4; ++i) out[i] = static_cast<float>(r[i] >> 8) * (1.0f / 16777216.0f);
    return out;
  }
  constexpr float uniform(std::uint64_t element) const {
    return uniform4(static_cast<std::uint32_t>(element >> 2))[element & 3];
  }
};

} // namespace dsa
