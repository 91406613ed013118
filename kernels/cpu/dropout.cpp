// Dropout on CPU: Philox blocks of four elements, OpenMP over blocks. The mask depends
// only on (stream, element), never on threads, chunking or the vector path. The loops
// (dropout_impl.inc) are compiled for the build's target and for AVX-512, chosen by
// active_isa(), with the same bits on both.
#include "kernels/cpu/dropout.hpp"

#include "core/error.hpp"
#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/philox_vec.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

namespace dsa::cpu {
namespace {

// Philox blocks per philox_words call, and the elements they cover.
constexpr std::int64_t group = 64;
constexpr std::int64_t max_group_elements = 4 * group;
// Below this many Philox blocks a parallel region costs more than it saves.
constexpr std::int64_t parallel_threshold_blocks = 1 << 12;

void check_args(float p, std::int64_t n) {
  DSA_CHECK(p >= 0.0f && p < 1.0f, "dropout: p={} outside [0, 1)", p);
  DSA_CHECK(n >= 0 && (n + 3) / 4 <= std::int64_t{std::numeric_limits<std::uint32_t>::max()} + 1,
            "dropout: n={} exceeds the 2^32 Philox blocks of one stream", n);
}

// Runs fn(words, offset, count) over the elements [begin, begin + n) of the stream, a group
// of Philox blocks at a time: `count` elements from begin + offset, whose words philox_words
// made (on `path`; the same words on every path), so the decisions are common::dropout_keep's.
// In parallel over groups when `parallel` and the range is large.
template <class Fn>
void for_each_group(isa path, const philox_stream& stream, std::int64_t begin, std::int64_t n, bool parallel,
                    Fn fn) {
  const std::int64_t first_block = begin / 4, end = begin + n;
  const std::int64_t blocks = (end + 3) / 4 - first_block, groups = (blocks + group - 1) / group;
  auto run = [&](std::int64_t g) {
    std::uint32_t words[4 * group];
    const std::int64_t first = first_block + g * group, count = std::min(group, first_block + blocks - first);
    philox_words(path, stream, static_cast<std::uint32_t>(first), count, words);
    const std::int64_t lo = std::max(4 * first, begin), hi = std::min(4 * (first + count), end);
    fn(words + (lo - 4 * first), lo - begin, hi - lo);
  };
  if (!parallel || blocks < parallel_threshold_blocks) {
    // No parallel construct at all: fused kernels call this per row from inside their own
    // region, where even an if(false) region costs a team set-up per call.
    for (std::int64_t g = 0; g < groups; ++g) run(g);
    return;
  }
#pragma omp parallel for schedule(static)
  for (std::int64_t g = 0; g < groups; ++g) run(g);
}

} // namespace

namespace dropout_base {
#include "kernels/cpu/dropout_impl.inc"
} // namespace dropout_base

DSA_AVX512_REGION_BEGIN
namespace dropout_avx512 {
#include "kernels/cpu/dropout_impl.inc"
} // namespace dropout_avx512
DSA_AVX512_REGION_END

namespace {

// Elements [begin, begin + n) of the stream: y[k], mask[k] for element begin + k.
void apply(isa path, float* y, std::uint8_t* mask, const float* x, const float* residual, float p,
           const philox_stream& stream, std::int64_t begin, std::int64_t n, bool parallel) {
  check_path(path, "dropout");
  if (p == 0.0f) { // every uniform is >= 0: all kept, scale 1; skip the RNG
    if (residual) {
#pragma omp simd
      for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] + residual[i];
    } else if (y != x) {
      std::memmove(y, x, static_cast<std::size_t>(n) * sizeof(float));
    }
    if (mask) std::fill(mask, mask + n, std::uint8_t{1});
    return;
  }
  const float scale = 1.0f / (1.0f - p);
  for_each_group(path, stream, begin, n, parallel, [&](const std::uint32_t* words, std::int64_t base, std::int64_t count) {
    std::uint8_t* m = mask ? mask + base : nullptr;
    const float* r = residual ? residual + base : nullptr;
    if (path == isa::avx512) return dropout_avx512::apply_words(y + base, m, x + base, r, words, count, p, scale);
    dropout_base::apply_words(y + base, m, x + base, r, words, count, p, scale);
  });
}

} // namespace

void dropout_forward(isa path, float* y, std::uint8_t* mask, const float* x, float p, const philox_stream& stream,
                     std::int64_t n) {
  check_args(p, n);
  apply(path, y, mask, x, nullptr, p, stream, 0, n, true);
}

void check_dropout_elements(std::int64_t n, const char* who) {
  DSA_CHECK(n >= 0 && (n + 3) / 4 <= std::int64_t{std::numeric_limits<std::uint32_t>::max()} + 1,
            "{}: {} elements exceed the 2^32 Philox blocks of one dropout stream", who, n);
}

void dropout_range(isa path, float* y, const float* x, float p, const philox_stream& stream, std::int64_t begin,
                   std::int64_t n) {
  DSA_CHECK(begin >= 0 && n >= 0, "dropout_range: begin={} n={}", begin, n);
  check_args(p, begin + n);
  apply(path, y, nullptr, x, nullptr, p, stream, begin, n, false);
}

void dropout_residual_forward(isa path, float* y, const float* x, const float* residual, float p,
                              const philox_stream& stream, std::int64_t n) {
  check_args(p, n);
  apply(path, y, nullptr, x, residual, p, stream, 0, n, true);
}

void dropout_mask(isa path, std::uint8_t* mask, float p, const philox_stream& stream, std::int64_t n) {
  check_args(p, n);
  check_path(path, "dropout");
  if (p == 0.0f) {
    std::fill(mask, mask + n, std::uint8_t{1});
    return;
  }
  for_each_group(path, stream, 0, n, true, [&](const std::uint32_t* words, std::int64_t base, std::int64_t count) {
    if (path == isa::avx512) return dropout_avx512::mask_words(mask + base, words, count, p);
    dropout_base::mask_words(mask + base, words, count, p);
  });
}

void dropout_backward(isa path, float* dx, const float* dy, const std::uint8_t* mask, float p, std::int64_t n) {
  check_args(p, n);
  check_path(path, "dropout");
  const float scale = 1.0f / (1.0f - p);
  constexpr std::int64_t chunk = std::int64_t{1} << 14;
  const std::int64_t chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (n >= 4 * parallel_threshold_blocks)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t b = c * chunk, e = std::min(n, b + chunk);
    if (path == isa::avx512)
      dropout_avx512::apply_mask(dx, dy, mask, scale, b, e);
    else
      dropout_base::apply_mask(dx, dy, mask, scale, b, e);
  }
}

void dropout_forward(float* y, std::uint8_t* mask, const float* x, float p, const philox_stream& stream,
                     std::int64_t n) {
  dropout_forward(active_isa(), y, mask, x, p, stream, n);
}

void dropout_residual_forward(float* y, const float* x, const float* residual, float p, const philox_stream& stream,
                              std::int64_t n) {
  dropout_residual_forward(active_isa(), y, x, residual, p, stream, n);
}

void dropout_mask(std::uint8_t* mask, float p, const philox_stream& stream, std::int64_t n) {
  dropout_mask(active_isa(), mask, p, stream, n);
}

void dropout_backward(float* dx, const float* dy, const std::uint8_t* mask, float p, std::int64_t n) {
  dropout_backward(active_isa(), dx, dy, mask, p, n);
}

} // namespace dsa::cpu
