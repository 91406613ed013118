// Philox4x32-10 words for many consecutive blocks of a stream at once: the AVX-512 path
// runs 16 blocks per instruction, the AVX2 path 8, the scalar path (core/philox.hpp's
// philox4x32, the specification) one. Every path gives the same words: dropout masks do
// not depend on the CPU they were drawn on (test_philox_vec checks each path this CPU has).
#pragma once

#include "core/philox.hpp"
#include "kernels/cpu/isa.hpp"

#include <cstdint>

namespace dsa::cpu {

// out[4 b + k] = word k of block first + b, for b in [0, blocks), with the given ISA (at
// most the CPU's best).
void philox_words(isa path, const philox_stream& stream, std::uint32_t first, std::int64_t blocks,
                  std::uint32_t* out);
// The same with active_isa().
void philox_words(const philox_stream& stream, std::uint32_t first, std::int64_t blocks, std::uint32_t* out);

// A word's uniform in [0, 1), as philox_stream::uniform4 makes it.
inline float philox_uniform(std::uint32_t word) { return static_cast<float>(word >> 8) * (1.0f / 16777216.0f); }

} // namespace dsa::cpu
