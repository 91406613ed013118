// Scaled masked softmax on CPU: OpenMP over rows, a branch-free exp so the inner
// loops vectorize, masked keys written as exact zeros.
#include "kernels/cpu/softmax.hpp"

#include "core/error.hpp"
#include "kernels/cpu/vec_math.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace dsa::cpu {
namespace {

constexpr std::int64_t parallel_threshold = 1 << 14;

// x where mask != 0, else -inf. Blended with integer ops: a float select whose arm holds
// arithmetic is not if-converted (the arm may trap), so the loop would stay scalar.
inline float keep_or_ninf(float x, float mask) {
  const std::uint32_t keep = mask != 0.0f ? 0xFFFFFFFFu : 0u;
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits = (bits & keep) | (0xFF800000u & ~keep); // 0xFF800000 = -inf
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// One row: probs = softmax(scale * s) over keys with mask != 0; may alias.
void forward_row(float* probs, const float* s, const float* mask, float scale, std::int64_t tk) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  float mx = ninf;
  if (mask) {
#pragma omp simd reduction(max : mx)
    for (std::int64_t k = 0; k < tk; ++k) {
      const float v = keep_or_ninf(scale * s[k], mask[k]);
      probs[k] = v;
      mx = v > mx ? v : mx;
    }
  } else {
#pragma omp simd reduction(max : mx)
    for (std::int64_t k = 0; k < tk; ++k) {
      const float v = scale * s[k];
      probs[k] = v;
      mx = v > mx ? v : mx;
    }
  }
  if (mx == ninf) { // every key masked
    for (std::int64_t k = 0; k < tk; ++k)
      probs[k] = 0.0f;
    return;
  }
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t k = 0; k < tk; ++k) {
    const float e = vec::exp_nonpositive(probs[k] - mx);
    probs[k] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (std::int64_t k = 0; k < tk; ++k)
    probs[k] *= inv;
}

void check_sizes(std::int64_t rows, std::int64_t tk) {
  DSA_CHECK(rows >= 0 && tk > 0, "softmax: bad sizes rows={} tk={}", rows, tk);
}

} // namespace

void softmax_forward(float* probs, const float* scores, const float* key_mask, float scale,
                     std::int64_t batch, std::int64_t heads, std::int64_t tq, std::int64_t tk) {
  const std::int64_t rows = batch * heads * tq, per_batch = heads * tq;
  check_sizes(rows, tk);
#pragma omp parallel for schedule(static) if (rows * tk >= parallel_threshold)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* mask = key_mask ? key_mask + (r / per_batch) * tk : nullptr;
    forward_row(probs + r * tk, scores + r * tk, mask, scale, tk);
  }
}

void softmax_backward(float* dscores, const float* dprobs, const float* probs, float scale,
                      std::int64_t rows, std::int64_t tk) {
  check_sizes(rows, tk);
#pragma omp parallel for schedule(static) if (rows * tk >= parallel_threshold)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* dp = dprobs + r * tk;
    const float* p = probs + r * tk;
    float* ds = dscores + r * tk;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (std::int64_t k = 0; k < tk; ++k)
      dot += dp[k] * p[k];
#pragma omp simd
    for (std::int64_t k = 0; k < tk; ++k)
      ds[k] = scale * p[k] * (dp[k] - dot);
  }
}

void softmax_forward_ref(float* probs, const float* scores, const float* key_mask, float scale,
                         std::int64_t batch, std::int64_t heads, std::int64_t tq, std::int64_t tk) {
  const std::int64_t rows = batch * heads * tq, per_batch = heads * tq;
  check_sizes(rows, tk);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* s = scores + r * tk;
    const float* mask = key_mask ? key_mask + (r / per_batch) * tk : nullptr;
    auto kept = [&](std::int64_t k) { return !mask || mask[k] != 0.0f; };
    bool any = false;
    double mx = 0.0;
    for (std::int64_t k = 0; k < tk; ++k)
      if (kept(k)) {
        double v = static_cast<double>(scale) * s[k];
        mx = any ? std::fmax(mx, v) : v;
        any = true;
      }
    double sum = 0.0;
    for (std::int64_t k = 0; k < tk; ++k)
      if (kept(k))
        sum += std::exp(static_cast<double>(scale) * s[k] - mx);
    for (std::int64_t k = 0; k < tk; ++k)
      probs[r * tk + k] =
          any && kept(k)
              ? static_cast<float>(std::exp(static_cast<double>(scale) * s[k] - mx) / sum)
              : 0.0f;
  }
}

void softmax_backward_ref(float* dscores, const float* dprobs, const float* probs, float scale,
                          std::int64_t rows, std::int64_t tk) {
  check_sizes(rows, tk);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* dp = dprobs + r * tk;
    const float* p = probs + r * tk;
    double dot = 0.0;
    for (std::int64_t k = 0; k < tk; ++k)
      dot += static_cast<double>(dp[k]) * p[k];
    for (std::int64_t k = 0; k < tk; ++k)
      dscores[r * tk + k] = static_cast<float>(static_cast<double>(scale) * p[k] * (dp[k] - dot));
  }
}

} // namespace dsa::cpu
