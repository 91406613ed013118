// Scaled masked softmax on CPU: OpenMP over rows, a branch-free exp so the inner
// loops vectorize, masked keys written as exact zeros.
#include "kernels/cpu/softmax.hpp"

#include "core/error.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace dsa::cpu {
namespace {

constexpr std::int64_t parallel_threshold = 1 << 14;

// exp(x) for x <= 0 with ~1 ulp error, written without calls or branches so that
// `omp simd` loops vectorize it (libm's expf does not vectorize without -ffast-math).
// x = n ln2 + r, |r| <= ln2/2, exp(r) by a degree-7 Taylor polynomial (truncation
// < 1e-8 relative), times 2^n built in the exponent bits. Results below ~2^-126.5
// (x < -87.7, -inf included) are exactly 0: subnormals flushed, n stays >= -127.
inline float exp_nonpositive(float x) {
  // Clamp to >= -88 by an unsigned min of the bits (for negative floats the pattern
  // grows with magnitude): a float compare is a possible trap that stops GCC's
  // if-conversion, and so vectorization, under the default -ftrapping-math.
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u = u < 0xC2B00000u ? u : 0xC2B00000u; // -88.0f
  std::memcpy(&x, &u, sizeof x);
  // Round to nearest by the 1.5 * 2^23 trick (|x log2 e| < 2^22); nearbyint is a call.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

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
    const float e = exp_nonpositive(probs[k] - mx);
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
