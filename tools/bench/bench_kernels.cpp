// dsactor bench kernels: GEMM at BERT shapes against the best square-size GEMM
// of this machine, fused Adam against the memory-bandwidth bound from a
// STREAM-style triad, and one BERT-mini training step against the GEMM peak.
// Every figure is measured in the same run; the last line is one JSON object.
#include "tools/bench/bench_kernels.hpp"

#include "kernels/cpu/adam.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/gemm_bf16.hpp"
#include "core/tensor.hpp"
#include "tools/bench/bench_util.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <immintrin.h>
#include <cmath>
#include <vector>

namespace dsa::tools {
namespace {

// 64-byte aligned, as every tensor is (unaligned buffers cost Adam ~10% here).
struct buffer {
  tensor t;
  float* data() { return t.data<float>(); }
};

buffer filled(std::int64_t n, float base) {
  buffer b{tensor::empty({n}, dtype::f32)};
  for (std::int64_t i = 0; i < n; ++i) b.data()[i] = base + 1e-3f * static_cast<float>(i % 97);
  return b;
}

double gemm_gflops(std::int64_t m, std::int64_t n, std::int64_t k, cpu::transpose ta, cpu::transpose tb, int reps,
                   bool bf16 = false) {
  auto a = filled(m * k, 0.5f), b = filled(k * n, 0.25f), c = filled(m * n, 0.0f);
  cpu::gemm_shape s{m, n, k, ta, tb};
  cpu::bf16_operands_scope mode(bf16);
  double secs = best_seconds(reps, [&] { cpu::gemm(c.data(), a.data(), b.data(), s); });
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / secs / 1e9;
}

// STREAM's triad over f32 arrays, 12 bytes per element, in the two forms that move
// exactly those bytes: a = b + s*c with non-temporal stores (plain stores would also
// read `a` first: write-allocate), and a = a + s*c (read, then write the same lines,
// Adam's own pattern). The faster of the two is the machine's bandwidth bound.
struct triad_arrays {
  explicit triad_arrays(std::int64_t n) : n(n / 8 * 8), a(filled(this->n, 0.0f)), b(filled(this->n, 1.0f)),
                                          c(filled(this->n, 2.0f)) {}
  triad_report measure(int reps) {
    float* pa = a.data();
    const float* pb = b.data();
    const float* pc = c.data();
    const float s = 0.5f;
    const std::int64_t len = n;
    triad_report r;
    double secs = best_seconds(reps, [&] {
#if defined(__AVX2__) && defined(__FMA__)
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < len; i += 8)
        _mm256_stream_ps(pa + i, _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_load_ps(pc + i), _mm256_load_ps(pb + i)));
      _mm_sfence();
#else
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < len; ++i) pa[i] = pb[i] + s * pc[i];
#endif
    });
    r.streaming_gbps = 12.0 * static_cast<double>(len) / secs / 1e9;
    secs = best_seconds(reps, [&] {
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < len; ++i) pa[i] = pa[i] + s * pc[i];
    });
    r.in_place_gbps = 12.0 * static_cast<double>(len) / secs / 1e9;
    return r;
  }
  std::int64_t n;
  buffer a, b, c;
};

struct adam_arrays {
  explicit adam_arrays(std::int64_t n)
      : n(n), p(filled(n, 0.1f)), g(filled(n, 0.01f)), m(filled(n, 0.0f)), v(filled(n, 0.0f)) {
    ap.weight_decay = 0.01f;
  }
  double params_per_s(int reps) {
    double secs = best_seconds(reps, [&] {
      cpu::adam_update(p.data(), m.data(), v.data(), g.data(), nullptr, dtype::f32, ap, n);
      ++ap.step;
    });
    return static_cast<double>(n) / secs;
  }
  std::int64_t n;
  buffer p, g, m, v;
  cpu::adam_params ap;
};

} // namespace

gemm_report bench_gemm(const bench_sizes& sizes) {
  gemm_report r;
  for (std::int64_t sq : sizes.square) r.peak_gflops = std::max(r.peak_gflops, gemm_gflops(sq, sq, sq, cpu::transpose::no, cpu::transpose::no, sizes.reps));
  // BERT-base layer GEMMs for B*T tokens: QKV/out-proj, FFN up and down, forward
  // and the two backward products (dX = dY W, dW = dY^T X).
  const std::int64_t t = sizes.tokens, h = 768, ff = 3072;
  struct shape { const char* name; std::int64_t m, n, k; cpu::transpose ta, tb; };
  const shape shapes[] = {
      {"attn proj fwd  (T x H) * (H x H)^T", t, h, h, cpu::transpose::no, cpu::transpose::yes},
      {"ffn up fwd     (T x H) * (FF x H)^T", t, ff, h, cpu::transpose::no, cpu::transpose::yes},
      {"ffn down fwd   (T x FF) * (H x FF)^T", t, h, ff, cpu::transpose::no, cpu::transpose::yes},
      {"ffn up dX      (T x FF) * (FF x H)", t, h, ff, cpu::transpose::no, cpu::transpose::no},
      {"ffn up dW      (T x FF)^T * (T x H)", ff, h, t, cpu::transpose::yes, cpu::transpose::no},
  };
  const bool bf16 = cpu::bf16_gemm_supported();
  const bool chosen = bf16 && cpu::bf16_gemm_runtime_shapes();
  double flops = 0, secs = 0, bf16_secs[2] = {0, 0};
  // The bf16 product with oneDNN primitives for fixed shapes and with shapes at run time
  // (gemm_bf16.hpp), the chosen way last so that its primitives are the warm ones.
  auto bf16_both = [&](std::int64_t m, std::int64_t n, std::int64_t k, cpu::transpose ta, cpu::transpose tb) {
    std::array<double, 2> g16{0, 0};
    if (!bf16) return g16;
    for (bool runtime : {!chosen, chosen}) {
      cpu::set_bf16_gemm_runtime_shapes(runtime);
      g16[runtime] = gemm_gflops(m, n, k, ta, tb, sizes.reps, true);
    }
    return g16;
  };
  for (const auto& s : shapes) {
    double g = gemm_gflops(s.m, s.n, s.k, s.ta, s.tb, sizes.reps);
    const auto g16 = bf16_both(s.m, s.n, s.k, s.ta, s.tb);
    double f = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
    flops += f;
    secs += f / (g * 1e9);
    for (int way = 0; way < 2 && bf16; ++way) bf16_secs[way] += f / (g16[way] * 1e9);
    r.rows.push_back({s.name, g, g16[chosen]});
  }
  r.bert_gflops = flops / secs / 1e9;
  if (bf16) {
    r.bf16_bert_gflops = flops / bf16_secs[chosen] / 1e9;
    r.bf16_fixed_bert_gflops = flops / bf16_secs[0] / 1e9;
    r.bf16_runtime_bert_gflops = flops / bf16_secs[1] / 1e9;
    // BERT-mini's masked-LM decoder: its row count (the micro-batch's masked tokens) changes
    // from one micro-batch to the next.
    const auto decoder = bf16_both(150, 8000, 256, cpu::transpose::no, cpu::transpose::yes);
    r.bf16_fixed_decoder_gflops = decoder[0];
    r.bf16_runtime_decoder_gflops = decoder[1];
  }
  return r;
}

// The machine's bandwidth drifts within a run (a shared host): the triad and Adam are
// measured back to back in each round, and the ratio is the median of the rounds' ratios.
adam_report bench_adam(const bench_sizes& sizes) {
  triad_arrays triad(sizes.stream_elements);
  adam_arrays adam(sizes.adam_params);
  std::vector<double> streaming, in_place, params, ratios;
  for (int round = 0; round < std::max(sizes.adam_rounds, 1); ++round) {
    const triad_report t = triad.measure(sizes.reps);
    const double p = adam.params_per_s(sizes.reps);
    // Adam reads param, grad, m, v (16 B) and writes param, m, v (12 B): 28 B per parameter.
    const double bound = std::max(t.streaming_gbps, t.in_place_gbps) * 1e9 / 28.0;
    streaming.push_back(t.streaming_gbps);
    in_place.push_back(t.in_place_gbps);
    params.push_back(p);
    ratios.push_back(p / bound);
  }
  adam_report r;
  r.rounds = static_cast<int>(ratios.size());
  r.triad_streaming_gbps = median(streaming);
  r.triad_in_place_gbps = median(in_place);
  r.triad_gbps = std::max(r.triad_streaming_gbps, r.triad_in_place_gbps);
  r.params_per_s = median(params);
  r.bound_params_per_s = r.triad_gbps * 1e9 / 28.0;
  r.ratio_to_bound = median(ratios);
  r.ratio_min = *std::min_element(ratios.begin(), ratios.end());
  r.ratio_max = *std::max_element(ratios.begin(), ratios.end());
  return r;
}

} // namespace dsa::tools
