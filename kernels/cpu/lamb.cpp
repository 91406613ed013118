// LAMB as DeepSpeed's FusedLamb (eps outside the square root): two passes per
// tensor, the first updating m, v and forming the update with its norm, the second
// applying the trust ratio. Norm partial sums are per fixed block of lamb_norm_block
// elements, summed in block order, so the result depends neither on the number of
// OpenMP threads nor on how a tensor's blocks are spread over ZeRO partitions. The AVX-512
// path (active_isa()) gives the AVX2 path's bits; the scalar path sums the squares in another
// order, so its norms agree with theirs within rounding.
#include "kernels/cpu/lamb.hpp"

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/vec_math.hpp"
#include "kernels/cpu/vec_math512.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include <immintrin.h>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define DSA_LAMB_AVX2 1
#endif

namespace dsa::cpu {
namespace {

// Elements per OpenMP work item of pass two, and the size above which pass one runs its
// norm blocks on several threads. Neither changes a result: norm partial sums are per
// lamb_norm_block, whichever thread computes them.
constexpr std::int64_t parallel_above = 16384;

struct lamb_consts {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay;
  float inv_bias1;      // 1 / (1 - beta1^t), or 1
  float inv_sqrt_bias2; // 1 / sqrt(1 - beta2^t), or 1
};

lamb_consts make_consts(const lamb_params& p) {
  DSA_CHECK(p.step >= 1, "lamb step must be >= 1, got {}", p.step);
  DSA_CHECK(p.min_coeff <= p.max_coeff, "lamb min_coeff {} > max_coeff {}", p.min_coeff, p.max_coeff);
  double bc1 = 1.0, bc2 = 1.0;
  if (p.correction == bias_correction::on) {
    bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
    bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  }
  return {p.beta1,        p.beta2,        1.0f - p.beta1, 1.0f - p.beta2, p.eps, p.weight_decay,
          static_cast<float>(1.0 / bc1), static_cast<float>(1.0 / std::sqrt(bc2))};
}

// Pass 1 on one element; returns the update u and leaves m, v updated.
inline float lamb_update_term(float p, float& m, float& v, float g, const lamb_consts& c) {
  float mm = std::fma(g, c.one_minus_beta1, c.beta1 * m);
  float vv = std::fma(g * g, c.one_minus_beta2, c.beta2 * v);
  m = mm;
  v = vv;
  float den = std::fma(std::sqrt(vv), c.inv_sqrt_bias2, c.eps);
  return std::fma(c.weight_decay, p, (mm * c.inv_bias1) / den);
}

inline std::uint16_t to_half(float x, dtype t) { return t == dtype::f16 ? f32_to_f16(x) : f32_to_bf16(x); }

// The AVX2 body's step on 8 elements: m, v and work updated, p^2 and u^2 added into four
// double lanes (lane j takes elements j and j + 4). Marked for AVX2 + FMA so that the AVX-512
// path's last group of 8 can take it in a baseline build too.
#define DSA_LAMB_AVX2_TARGET __attribute__((target("avx2,fma")))
DSA_LAMB_AVX2_TARGET inline __m256d sum_squares8(__m256 x) {
  const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
  return _mm256_add_pd(_mm256_mul_pd(lo, lo), _mm256_mul_pd(hi, hi));
}

DSA_LAMB_AVX2_TARGET inline double hsum(__m256d x) {
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, x);
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

DSA_LAMB_AVX2_TARGET inline void step8(const float* param, float* m, float* v, const float* grad, float* work,
                                       const lamb_consts& c, __m256d& acc_p, __m256d& acc_u) {
  const __m256 p = _mm256_loadu_ps(param), g = _mm256_loadu_ps(grad);
  const __m256 mm = _mm256_fmadd_ps(g, _mm256_set1_ps(c.one_minus_beta1),
                                    _mm256_mul_ps(_mm256_set1_ps(c.beta1), _mm256_loadu_ps(m)));
  const __m256 vv = _mm256_fmadd_ps(_mm256_mul_ps(g, g), _mm256_set1_ps(c.one_minus_beta2),
                                    _mm256_mul_ps(_mm256_set1_ps(c.beta2), _mm256_loadu_ps(v)));
  const __m256 den = _mm256_fmadd_ps(_mm256_sqrt_ps(vv), _mm256_set1_ps(c.inv_sqrt_bias2), _mm256_set1_ps(c.eps));
  const __m256 u = _mm256_fmadd_ps(_mm256_set1_ps(c.weight_decay), p,
                                   _mm256_div_ps(_mm256_mul_ps(mm, _mm256_set1_ps(c.inv_bias1)), den));
  _mm256_storeu_ps(m, mm);
  _mm256_storeu_ps(v, vv);
  _mm256_storeu_ps(work, u);
  acc_p = _mm256_add_pd(acc_p, sum_squares8(p));
  acc_u = _mm256_add_pd(acc_u, sum_squares8(u));
}

// The AVX2 body on 16 lanes. The squares are summed per 8 elements into the same four
// double lanes in the same order as the AVX2 body, and a last group of 8 takes step8
// itself, so both paths give the same bits. Returns how many elements it did (the caller
// finishes with the scalar element).
DSA_AVX512_CODE_BEGIN
DSA_AVX512_TARGET std::int64_t pass_one_avx512(const float* param, float* m, float* v, const float* grad, float* work,
                                               const lamb_consts& c, std::int64_t n, double* sp, double* su) {
  const __m512 b1 = _mm512_set1_ps(c.beta1), b2 = _mm512_set1_ps(c.beta2);
  const __m512 omb1 = _mm512_set1_ps(c.one_minus_beta1), omb2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 eps = _mm512_set1_ps(c.eps), wd = _mm512_set1_ps(c.weight_decay);
  const __m512 ib1 = _mm512_set1_ps(c.inv_bias1), ib2 = _mm512_set1_ps(c.inv_sqrt_bias2);
  __m256d acc_p = _mm256_setzero_pd(), acc_u = _mm256_setzero_pd();
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 p = _mm512_loadu_ps(param + i), g = _mm512_loadu_ps(grad + i);
    const __m512 mm = _mm512_fmadd_ps(g, omb1, _mm512_mul_ps(b1, _mm512_loadu_ps(m + i)));
    const __m512 vv = _mm512_fmadd_ps(_mm512_mul_ps(g, g), omb2, _mm512_mul_ps(b2, _mm512_loadu_ps(v + i)));
    const __m512 den = _mm512_fmadd_ps(_mm512_sqrt_ps(vv), ib2, eps);
    const __m512 u = _mm512_fmadd_ps(wd, p, _mm512_div_ps(_mm512_mul_ps(mm, ib1), den));
    _mm512_storeu_ps(m + i, mm);
    _mm512_storeu_ps(v + i, vv);
    _mm512_storeu_ps(work + i, u);
    acc_p = _mm256_add_pd(acc_p, sum_squares8(_mm512_castps512_ps256(p)));
    acc_p = _mm256_add_pd(acc_p, sum_squares8(_mm512_extractf32x8_ps(p, 1)));
    acc_u = _mm256_add_pd(acc_u, sum_squares8(_mm512_castps512_ps256(u)));
    acc_u = _mm256_add_pd(acc_u, sum_squares8(_mm512_extractf32x8_ps(u, 1)));
  }
  if (i + 8 <= n) {
    step8(param + i, m + i, v + i, grad + i, work + i, c, acc_p, acc_u);
    i += 8;
  }
  *sp = hsum(acc_p);
  *su = hsum(acc_u);
  return i;
}

DSA_AVX512_TARGET std::int64_t pass_two_avx512(float* param, const float* work, std::uint16_t* half_out, bool bf16,
                                               float scale, std::int64_t n) {
  const __m512 s = _mm512_set1_ps(scale);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 p = _mm512_fmadd_ps(_mm512_loadu_ps(work + i), s, _mm512_loadu_ps(param + i));
    _mm512_storeu_ps(param + i, p);
    if (half_out) vec512::store_half16(half_out + i, p, bf16);
  }
  return i;
}
DSA_AVX512_CODE_END

// Pass 1 over a chunk: writes u into work; returns sum p^2 and sum u^2.
void pass_one(isa path, const float* param, float* m, float* v, const float* grad, float* work,
              const lamb_consts& c, std::int64_t n, double* sum_p2, double* sum_u2) {
  std::int64_t i = 0;
  double sp = 0.0, su = 0.0;
  if (path == isa::avx512) i = pass_one_avx512(param, m, v, grad, work, c, n, &sp, &su);
#ifdef DSA_LAMB_AVX2
  if (path == isa::avx2) {
    __m256d acc_p = _mm256_setzero_pd(), acc_u = _mm256_setzero_pd();
    for (; i + 8 <= n; i += 8) step8(param + i, m + i, v + i, grad + i, work + i, c, acc_p, acc_u);
    sp = hsum(acc_p);
    su = hsum(acc_u);
  }
#endif
  for (; i < n; ++i) {
    float u = lamb_update_term(param[i], m[i], v[i], grad[i], c);
    work[i] = u;
    sp += static_cast<double>(param[i]) * param[i];
    su += static_cast<double>(u) * u;
  }
  *sum_p2 = sp;
  *sum_u2 = su;
}

// Pass 2 over a chunk: p += scale * u, with the half copy written alongside.
void pass_two(isa path, float* param, const float* work, std::uint16_t* half_out, dtype half_type, float scale,
              std::int64_t n) {
  std::int64_t i = 0;
  if (path == isa::avx512) i = pass_two_avx512(param, work, half_out, half_type == dtype::bf16, scale, n);
#ifdef DSA_LAMB_AVX2
  if (path == isa::avx2) {
    const __m256 s = _mm256_set1_ps(scale);
    for (; i + 8 <= n; i += 8) {
      __m256 p = _mm256_fmadd_ps(_mm256_loadu_ps(work + i), s, _mm256_loadu_ps(param + i));
      _mm256_storeu_ps(param + i, p);
      if (half_out) vec::store_half8(half_out + i, p, half_type == dtype::bf16);
    }
  }
#endif
  for (; i < n; ++i) {
    param[i] = std::fma(work[i], scale, param[i]);
    if (half_out) half_out[i] = to_half(param[i], half_type);
  }
}

// DeepSpeed's trust ratio: 1 when either norm is 0, else clamped ||p|| / ||u||.
double trust_ratio(double param_norm, double update_norm, double min_coeff, double max_coeff) {
  if (param_norm == 0.0 || update_norm == 0.0) return 1.0;
  return std::clamp(param_norm / update_norm, min_coeff, max_coeff);
}

} // namespace

void lamb_first_pass(float* m, float* v, float* work, double* block_sums, const float* param, const float* grad,
                     const lamb_params& params, std::int64_t n) {
  lamb_first_pass(active_isa(), m, v, work, block_sums, param, grad, params, n);
}

void lamb_first_pass(isa path, float* m, float* v, float* work, double* block_sums, const float* param,
                     const float* grad, const lamb_params& params, std::int64_t n) {
  check_path(path, "lamb");
  DSA_CHECK(n >= 0, "lamb_first_pass: negative size {}", n);
  const lamb_consts c = make_consts(params);
  const std::int64_t blocks = lamb_norm_blocks(n);
#pragma omp parallel for schedule(static) if (n > parallel_above)
  for (std::int64_t k = 0; k < blocks; ++k) {
    std::int64_t begin = k * lamb_norm_block, len = std::min(lamb_norm_block, n - begin);
    pass_one(path, param + begin, m + begin, v + begin, grad + begin, work + begin, c, len, &block_sums[2 * k],
             &block_sums[2 * k + 1]);
  }
}

void lamb_norm_totals(double totals[2], const double* block_sums, std::int64_t blocks) {
  for (std::int64_t k = 0; k < blocks; ++k) {
    totals[0] += block_sums[2 * k];
    totals[1] += block_sums[2 * k + 1];
  }
}

float lamb_trust_ratio(double sum_p2, double sum_u2, const lamb_params& params) {
  return static_cast<float>(trust_ratio(std::sqrt(sum_p2), std::sqrt(sum_u2), params.min_coeff, params.max_coeff));
}

void lamb_second_pass(float* param, std::uint16_t* half_out, const float* work, dtype half_type, float coeff,
                      const lamb_params& params, std::int64_t n) {
  lamb_second_pass(active_isa(), param, half_out, work, half_type, coeff, params, n);
}

void lamb_second_pass(isa path, float* param, std::uint16_t* half_out, const float* work, dtype half_type,
                      float coeff, const lamb_params& params, std::int64_t n) {
  check_path(path, "lamb");
  DSA_CHECK(n >= 0, "lamb_second_pass: negative size {}", n);
  DSA_CHECK(!half_out || half_type == dtype::f16 || half_type == dtype::bf16,
            "lamb_second_pass: half copy-out must be f16 or bf16, got {}", dtype_name(half_type));
  const float scale = -params.lr * coeff;
  const std::int64_t chunks = (n + parallel_above - 1) / parallel_above;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::int64_t k = 0; k < chunks; ++k) {
    std::int64_t begin = k * parallel_above, len = std::min(parallel_above, n - begin);
    pass_two(path, param + begin, work + begin, half_out ? half_out + begin : nullptr, half_type, scale, len);
  }
}

float lamb_update(float* param, float* m, float* v, const float* grad, float* work, std::uint16_t* half_out,
                  dtype half_type, const lamb_params& params, std::int64_t n) {
  return lamb_update(active_isa(), param, m, v, grad, work, half_out, half_type, params, n);
}

float lamb_update(isa path, float* param, float* m, float* v, const float* grad, float* work,
                  std::uint16_t* half_out, dtype half_type, const lamb_params& params, std::int64_t n) {
  DSA_CHECK(n >= 0, "lamb_update: negative size {}", n);
  DSA_CHECK(!half_out || half_type == dtype::f16 || half_type == dtype::bf16,
            "lamb_update: half copy-out must be f16 or bf16, got {}", dtype_name(half_type));
  make_consts(params); // checks the parameters even when there is nothing to update
  if (n == 0) return 1.0f;
  const std::int64_t blocks = lamb_norm_blocks(n);
  std::vector<double> block_sums(static_cast<std::size_t>(2 * blocks));
  lamb_first_pass(path, m, v, work, block_sums.data(), param, grad, params, n);
  double totals[2] = {0.0, 0.0};
  lamb_norm_totals(totals, block_sums.data(), blocks);
  const float coeff = lamb_trust_ratio(totals[0], totals[1], params);
  lamb_second_pass(path, param, half_out, work, half_type, coeff, params, n);
  return coeff;
}

float lamb_update_ref(float* param, float* m, float* v, const float* grad, const lamb_params& params,
                      std::int64_t n) {
  const double b1 = params.beta1, b2 = params.beta2, t = static_cast<double>(params.step);
  double bc1 = 1.0, bc2 = 1.0;
  if (params.correction == bias_correction::on) {
    bc1 = 1.0 - std::pow(b1, t);
    bc2 = 1.0 - std::pow(b2, t);
  }
  std::vector<double> update(static_cast<std::size_t>(n));
  double sum_p2 = 0.0, sum_u2 = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    double g = grad[i], p = param[i];
    double mm = b1 * m[i] + (1.0 - b1) * g;
    double vv = b2 * v[i] + (1.0 - b2) * g * g;
    double u = (mm / bc1) / (std::sqrt(vv / bc2) + params.eps) + params.weight_decay * p;
    m[i] = static_cast<float>(mm);
    v[i] = static_cast<float>(vv);
    update[static_cast<std::size_t>(i)] = u;
    sum_p2 += p * p;
    sum_u2 += u * u;
  }
  double coeff = trust_ratio(std::sqrt(sum_p2), std::sqrt(sum_u2), params.min_coeff, params.max_coeff);
  for (std::int64_t i = 0; i < n; ++i)
    param[i] = static_cast<float>(param[i] - params.lr * coeff * update[static_cast<std::size_t>(i)]);
  return static_cast<float>(coeff);
}

} // namespace dsa::cpu
