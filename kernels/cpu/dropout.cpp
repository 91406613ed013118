// Dropout on CPU: Philox blocks of four elements, OpenMP over blocks. The mask depends
// only on (stream, element), never on threads or chunking.
#include "kernels/cpu/dropout.hpp"

#include "core/error.hpp"
#include "kernels/common/dropout_math.hpp"
#include "kernels/cpu/philox_vec.hpp"

#include <algorithm>
#include <limits>

namespace dsa::cpu {
namespace {

// Below this many Philox blocks a parallel region costs more than it saves.
constexpr std::int64_t parallel_threshold_blocks = 1 << 12;

void check_args(float p, std::int64_t n) {
  DSA_CHECK(p >= 0.0f && p < 1.0f, "dropout: p={} outside [0, 1)", p);
  DSA_CHECK(n >= 0 && (n + 3) / 4 <= std::int64_t{std::numeric_limits<std::uint32_t>::max()} + 1,
            "dropout: n={} exceeds the 2^32 Philox blocks of one stream", n);
}

// Calls fn(i, keep) for every element i in [0, n), keep = uniform(i) >= p. The Philox words
// come a group of blocks at a time from philox_words (AVX-512 / AVX2 / scalar, the same
// words on every path), so the decisions are common::dropout_keep's.
template <class Fn>
void for_each_keep(float p, const philox_stream& stream, std::int64_t n, Fn fn) {
  constexpr std::int64_t group = 64; // blocks per philox_words call
  const std::int64_t blocks = (n + 3) / 4, groups = (blocks + group - 1) / group;
#pragma omp parallel for schedule(static) if (blocks >= parallel_threshold_blocks)
  for (std::int64_t g = 0; g < groups; ++g) {
    std::uint32_t words[4 * group];
    const std::int64_t first = g * group, count = std::min(group, blocks - first);
    philox_words(stream, static_cast<std::uint32_t>(first), count, words);
    const std::int64_t base = 4 * first, elements = std::min<std::int64_t>(4 * count, n - base);
    for (std::int64_t k = 0; k < elements; ++k) fn(base + k, philox_uniform(words[k]) >= p);
  }
}

} // namespace

void dropout_forward(float* y, std::uint8_t* mask, const float* x, float p,
                     const philox_stream& stream, std::int64_t n) {
  check_args(p, n);
  if (p == 0.0f) { // every uniform is >= 0: all kept, scale 1; skip the RNG
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i)
      y[i] = x[i];
    if (mask)
      std::fill(mask, mask + n, std::uint8_t{1});
    return;
  }
  const float scale = 1.0f / (1.0f - p);
  for_each_keep(p, stream, n, [=](std::int64_t i, bool keep) {
    y[i] = common::dropout_apply(x[i], keep, scale);
    if (mask)
      mask[i] = keep ? 1 : 0;
  });
}

void dropout_mask(std::uint8_t* mask, float p, const philox_stream& stream, std::int64_t n) {
  check_args(p, n);
  if (p == 0.0f) {
    std::fill(mask, mask + n, std::uint8_t{1});
    return;
  }
  for_each_keep(p, stream, n, [=](std::int64_t i, bool keep) { mask[i] = keep ? 1 : 0; });
}

void dropout_backward(float* dx, const float* dy, const std::uint8_t* mask, float p,
                      std::int64_t n) {
  check_args(p, n);
  const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for simd schedule(static) if (n >= 4 * parallel_threshold_blocks)
  for (std::int64_t i = 0; i < n; ++i)
    dx[i] = common::dropout_apply(dy[i], mask[i] != 0, scale);
}

} // namespace dsa::cpu
