// Scaled masked softmax on CPU: OpenMP over rows, a branch-free exp so the inner
// loops vectorize, masked keys written as exact zeros. The loops (softmax_impl.inc) are
// compiled twice, for the build's target and for AVX-512 (16-lane vectors), chosen by
// active_isa(); the two add a row's sums in different orders, each path checked against
// the double references.
#include "kernels/cpu/softmax.hpp"

#include "core/error.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/dropout.hpp"
#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/vec_math.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace dsa::cpu {
namespace {

constexpr std::int64_t parallel_threshold = 1 << 14;

void check_sizes(std::int64_t rows, std::int64_t tk) {
  DSA_CHECK(rows >= 0 && tk > 0, "softmax: bad sizes rows={} tk={}", rows, tk);
}

} // namespace

namespace softmax_base {
#include "kernels/cpu/softmax_impl.inc"
} // namespace softmax_base

DSA_AVX512_REGION_BEGIN
namespace softmax_avx512 {
#include "kernels/cpu/softmax_impl.inc"
} // namespace softmax_avx512
DSA_AVX512_REGION_END

void softmax_forward(isa path, float* probs, const float* scores, const float* key_mask, float scale,
                     std::int64_t batch, std::int64_t heads, std::int64_t tq, std::int64_t tk) {
  const std::int64_t rows = batch * heads * tq, per_batch = heads * tq;
  check_sizes(rows, tk);
  check_path(path, "softmax");
  if (path == isa::avx512) return softmax_avx512::forward(probs, scores, key_mask, scale, rows, per_batch, tk);
  softmax_base::forward(probs, scores, key_mask, scale, rows, per_batch, tk);
}

void softmax_backward(isa path, float* dscores, const float* dprobs, const float* probs, float scale,
                      std::int64_t rows, std::int64_t tk) {
  softmax_backward(path, dscores, dprobs, probs, dtype::f32, scale, rows, tk);
}

namespace {

void backward(isa path, float* dscores, std::uint16_t* ds_bf16, const float* dprobs, const void* probs,
              dtype probs_type, float scale, float p, const philox_stream* stream, std::int64_t rows,
              std::int64_t tk) {
  check_sizes(rows, tk);
  check_path(path, "softmax");
  DSA_CHECK(probs_type == dtype::f32 || probs_type == dtype::f16 || probs_type == dtype::bf16,
            "softmax_backward: probabilities of {}; expected f32, f16 or bf16", dtype_name(probs_type));
  const bool f32 = probs_type == dtype::f32;
  const auto* p32 = f32 ? static_cast<const float*>(probs) : nullptr;
  const auto* p16 = f32 ? nullptr : static_cast<const std::uint16_t*>(probs);
  if (path == isa::avx512)
    return softmax_avx512::backward(path, dscores, ds_bf16, dprobs, p32, p16, probs_type, scale, p, stream, rows, tk);
  softmax_base::backward(path, dscores, ds_bf16, dprobs, p32, p16, probs_type, scale, p, stream, rows, tk);
}

} // namespace

void softmax_backward(isa path, float* dscores, const float* dprobs, const void* probs, dtype probs_type, float scale,
                      std::int64_t rows, std::int64_t tk) {
  backward(path, dscores, nullptr, dprobs, probs, probs_type, scale, 0.0f, nullptr, rows, tk);
}

void softmax_dropout_backward(isa path, float* dscores, const float* ddropped, const void* probs, dtype probs_type,
                              float scale, float p, const philox_stream& stream, std::int64_t rows,
                              std::int64_t tk) {
  DSA_CHECK(p >= 0.0f && p < 1.0f, "softmax_dropout_backward: p={} outside [0, 1)", p);
  check_dropout_elements(rows * tk, "softmax_dropout_backward");
  backward(path, dscores, nullptr, ddropped, probs, probs_type, scale, p, p > 0.0f ? &stream : nullptr, rows, tk);
}

void softmax_dropout_backward_bf16(isa path, std::uint16_t* dscores, const float* ddropped, const void* probs,
                                   dtype probs_type, float scale, float p, const philox_stream& stream,
                                   std::int64_t rows, std::int64_t tk) {
  DSA_CHECK(p >= 0.0f && p < 1.0f, "softmax_dropout_backward_bf16: p={} outside [0, 1)", p);
  check_dropout_elements(rows * tk, "softmax_dropout_backward_bf16");
  backward(path, nullptr, dscores, ddropped, probs, probs_type, scale, p, p > 0.0f ? &stream : nullptr, rows, tk);
}

void softmax_dropout_forward(isa path, const softmax_dropout_out& out, const float* scores, const float* key_mask,
                             float scale, float p, const philox_stream& stream, std::int64_t batch,
                             std::int64_t heads, std::int64_t tq, std::int64_t tk) {
  const std::int64_t rows = batch * heads * tq, per_batch = heads * tq;
  check_sizes(rows, tk);
  check_path(path, "softmax");
  const bool drop = out.dropped || out.dropped_half;
  DSA_CHECK(out.probs || out.probs_half || drop, "softmax_dropout_forward: no output");
  DSA_CHECK(!drop || (p > 0.0f && p < 1.0f), "softmax_dropout_forward: dropped outputs with p={}", p);
  check_dropout_elements(rows * tk, "softmax_dropout_forward");
  DSA_CHECK(!(out.probs_half || out.dropped_half) || out.half_type == dtype::f16 || out.half_type == dtype::bf16,
            "softmax_dropout_forward: half outputs of {}; expected f16 or bf16", dtype_name(out.half_type));
  if (path == isa::avx512)
    return softmax_avx512::forward_dropout(path, out, scores, key_mask, scale, p, stream, rows, per_batch, tk);
  softmax_base::forward_dropout(path, out, scores, key_mask, scale, p, stream, rows, per_batch, tk);
}

void softmax_forward(float* probs, const float* scores, const float* key_mask, float scale,
                     std::int64_t batch, std::int64_t heads, std::int64_t tq, std::int64_t tk) {
  softmax_forward(active_isa(), probs, scores, key_mask, scale, batch, heads, tq, tk);
}

void softmax_backward(float* dscores, const float* dprobs, const float* probs, float scale,
                      std::int64_t rows, std::int64_t tk) {
  softmax_backward(active_isa(), dscores, dprobs, probs, scale, rows, tk);
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
