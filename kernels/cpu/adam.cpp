// Adam / AdamW with DeepSpeed's CPU Adam rule: one pass over param, grad, m, v,
// AVX2/FMA when compiled for it, AVX-512 when active_isa() says so (the same bits on every
// path), OpenMP over fixed chunks, optional f16/bf16 copy-out.
#include "kernels/cpu/adam.hpp"

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/vec_math.hpp"
#include "kernels/cpu/vec_math512.hpp"

#include <algorithm>
#include <cmath>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define DSA_ADAM_AVX2 1
#endif

namespace dsa::cpu {
namespace {

// Elements per OpenMP work item: 64 KiB of each f32 stream, a multiple of the vector width.
constexpr std::int64_t chunk_elements = 16384;

} // namespace

common::adam_consts make_adam_consts(const adam_params& p) {
  DSA_CHECK(p.step >= 1, "adam step must be >= 1, got {}", p.step);
  double t = static_cast<double>(p.step);
  double bc1 = 1.0, bc2 = 1.0;
  if (p.correction == bias_correction::on) {
    bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), t);
    bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), t);
  }
  common::adam_consts c;
  c.beta1 = p.beta1;
  c.beta2 = p.beta2;
  c.one_minus_beta1 = 1.0f - p.beta1;
  c.one_minus_beta2 = 1.0f - p.beta2;
  c.eps = p.eps;
  c.step_size = static_cast<float>(-static_cast<double>(p.lr) / bc1);
  c.bias2_factor = static_cast<float>(1.0 / std::sqrt(bc2));
  bool decay = p.weight_decay > 0.0f;
  c.l2_decay = (decay && p.mode == adam_mode::adam) ? p.weight_decay : 0.0f;
  c.decoupled = (decay && p.mode == adam_mode::adamw) ? -p.lr * p.weight_decay : 0.0f;
  return c;
}

namespace {

// The scalar rule (kernels/common/adam_math.hpp); the vector body performs the same
// operations in the same order (explicit fma), so every element gets the same bits
// wherever it falls.
using common::adam_element;

inline std::uint16_t to_half(float x, dtype t) { return t == dtype::f16 ? f32_to_f16(x) : f32_to_bf16(x); }


// The AVX2 body's operations on 16 lanes (the same bits); returns how many elements it did.
DSA_AVX512_CODE_BEGIN
DSA_AVX512_TARGET std::int64_t adam_avx512(float* param, float* m, float* v, const float* grad,
                                           std::uint16_t* half_out, bool bf16, const common::adam_consts& c,
                                           std::int64_t n) {
  const __m512 b1 = _mm512_set1_ps(c.beta1), b2 = _mm512_set1_ps(c.beta2);
  const __m512 omb1 = _mm512_set1_ps(c.one_minus_beta1), omb2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 eps = _mm512_set1_ps(c.eps), step = _mm512_set1_ps(c.step_size);
  const __m512 bc2 = _mm512_set1_ps(c.bias2_factor);
  const __m512 l2 = _mm512_set1_ps(c.l2_decay), dec = _mm512_set1_ps(c.decoupled);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    constexpr std::int64_t ahead = 256; // as the AVX2 body: the four read streams 1 KiB ahead
    _mm_prefetch(reinterpret_cast<const char*>(param + i + ahead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(grad + i + ahead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(m + i + ahead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(v + i + ahead), _MM_HINT_T0);
    __m512 p = _mm512_loadu_ps(param + i);
    const __m512 g = _mm512_fmadd_ps(p, l2, _mm512_loadu_ps(grad + i));
    const __m512 mm = _mm512_fmadd_ps(g, omb1, _mm512_mul_ps(b1, _mm512_loadu_ps(m + i)));
    const __m512 vv = _mm512_fmadd_ps(_mm512_mul_ps(g, g), omb2, _mm512_mul_ps(b2, _mm512_loadu_ps(v + i)));
    const __m512 den = _mm512_fmadd_ps(_mm512_sqrt_ps(vv), bc2, eps);
    p = _mm512_fmadd_ps(p, dec, p);
    p = _mm512_fmadd_ps(_mm512_div_ps(mm, den), step, p);
    _mm512_storeu_ps(m + i, mm);
    _mm512_storeu_ps(v + i, vv);
    _mm512_storeu_ps(param + i, p);
    if (half_out) vec512::store_half16(half_out + i, p, bf16);
  }
  return i;
}
DSA_AVX512_CODE_END

void adam_chunk(isa path, float* param, float* m, float* v, const float* grad, std::uint16_t* half_out,
                dtype half_type, const common::adam_consts& c, std::int64_t n) {
  std::int64_t i = 0;
  if (path == isa::avx512) i = adam_avx512(param, m, v, grad, half_out, half_type == dtype::bf16, c, n);
#ifdef DSA_ADAM_AVX2
  if (path == isa::avx2) {
  const __m256 b1 = _mm256_set1_ps(c.beta1), b2 = _mm256_set1_ps(c.beta2);
  const __m256 omb1 = _mm256_set1_ps(c.one_minus_beta1), omb2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 eps = _mm256_set1_ps(c.eps), step = _mm256_set1_ps(c.step_size);
  const __m256 bc2 = _mm256_set1_ps(c.bias2_factor);
  const __m256 l2 = _mm256_set1_ps(c.l2_decay), dec = _mm256_set1_ps(c.decoupled);
  for (; i + 8 <= n; i += 8) {
    if ((i & 15) == 0) {
      // Seven streams outrun the hardware prefetchers of one core; fetching the four
      // read streams 1 KiB ahead measured ~8% more throughput from DRAM.
      constexpr std::int64_t ahead = 256;
      _mm_prefetch(reinterpret_cast<const char*>(param + i + ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(grad + i + ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(m + i + ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(v + i + ahead), _MM_HINT_T0);
    }
    __m256 p = _mm256_loadu_ps(param + i);
    __m256 g = _mm256_fmadd_ps(p, l2, _mm256_loadu_ps(grad + i));
    __m256 mm = _mm256_fmadd_ps(g, omb1, _mm256_mul_ps(b1, _mm256_loadu_ps(m + i)));
    __m256 vv = _mm256_fmadd_ps(_mm256_mul_ps(g, g), omb2, _mm256_mul_ps(b2, _mm256_loadu_ps(v + i)));
    __m256 den = _mm256_fmadd_ps(_mm256_sqrt_ps(vv), bc2, eps);
    p = _mm256_fmadd_ps(p, dec, p);
    p = _mm256_fmadd_ps(_mm256_div_ps(mm, den), step, p);
    _mm256_storeu_ps(m + i, mm);
    _mm256_storeu_ps(v + i, vv);
    _mm256_storeu_ps(param + i, p);
    if (half_out) vec::store_half8(half_out + i, p, half_type == dtype::bf16);
  }
  }
#endif
  for (; i < n; ++i) {
    adam_element(param[i], m[i], v[i], grad[i], c);
    if (half_out) half_out[i] = to_half(param[i], half_type);
  }
}

} // namespace

void adam_update(float* param, float* m, float* v, const float* grad, std::uint16_t* half_out, dtype half_type,
                 const adam_params& params, std::int64_t n) {
  adam_update(active_isa(), param, m, v, grad, half_out, half_type, params, n);
}

void adam_update(isa path, float* param, float* m, float* v, const float* grad, std::uint16_t* half_out,
                 dtype half_type, const adam_params& params, std::int64_t n) {
  check_path(path, "adam_update");
  DSA_CHECK(n >= 0, "adam_update: negative size {}", n);
  DSA_CHECK(!half_out || half_type == dtype::f16 || half_type == dtype::bf16,
            "adam_update: half copy-out must be f16 or bf16, got {}", dtype_name(half_type));
  if (n == 0) return;
  const common::adam_consts c = make_adam_consts(params);
  const std::int64_t chunks = (n + chunk_elements - 1) / chunk_elements;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::int64_t k = 0; k < chunks; ++k) {
    std::int64_t begin = k * chunk_elements;
    std::int64_t len = std::min(chunk_elements, n - begin);
    adam_chunk(path, param + begin, m + begin, v + begin, grad + begin, half_out ? half_out + begin : nullptr, half_type, c,
               len);
  }
}

void adam_update_ref(float* param, float* m, float* v, const float* grad, const adam_params& params,
                     std::int64_t n) {
  const double b1 = params.beta1, b2 = params.beta2, lr = params.lr, wd = params.weight_decay;
  const double t = static_cast<double>(params.step);
  double bc1 = 1.0, bc2 = 1.0;
  if (params.correction == bias_correction::on) {
    bc1 = 1.0 - std::pow(b1, t);
    bc2 = 1.0 - std::pow(b2, t);
  }
  for (std::int64_t i = 0; i < n; ++i) {
    double p = param[i], g = grad[i];
    if (params.mode == adam_mode::adam && wd > 0.0) g += wd * p;
    double mm = b1 * m[i] + (1.0 - b1) * g;
    double vv = b2 * v[i] + (1.0 - b2) * g * g;
    double den = std::sqrt(vv) / std::sqrt(bc2) + params.eps;
    if (params.mode == adam_mode::adamw && wd > 0.0) p -= lr * wd * p;
    p -= lr / bc1 * mm / den;
    m[i] = static_cast<float>(mm);
    v[i] = static_cast<float>(vv);
    param[i] = static_cast<float>(p);
  }
}

} // namespace dsa::cpu
