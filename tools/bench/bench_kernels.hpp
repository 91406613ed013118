// Kernel benchmarks used by `dsactor bench kernels`.
#pragma once

#include "core/dtype.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::tools {

struct bench_sizes {
  std::vector<std::int64_t> square{1024, 2048, 3072}; // square GEMM sizes for the peak
  std::int64_t tokens = 4096;                         // B*T of the BERT-shaped GEMMs (32 x 128)
  std::int64_t stream_elements = 1 << 25;             // as many elements as Adam's arrays: 128 MiB each
  std::int64_t adam_params = 1 << 25;                 // 32 M parameters, 512 MiB of state
  int reps = 3;
  int adam_rounds = 5; // paired triad/Adam rounds
};

struct gemm_report {
  double peak_gflops = 0;
  double bert_gflops = 0; // flop-weighted over the BERT shapes
  // bf16_gflops: the same product with bf16 operands through oneDNN (bf16.cpu_gemm's path,
  // the f32 -> bf16 rounding of both operands included); 0 where bf16 GEMM cannot run.
  struct row { std::string name; double gflops; double bf16_gflops = 0; };
  double bf16_bert_gflops = 0; // flop-weighted, as bert_gflops
  // The same with oneDNN primitives for fixed shapes and with shapes at run time (the
  // chosen one is bf16_bert_gflops), and both at BERT-mini's masked-LM decoder shape.
  double bf16_fixed_bert_gflops = 0, bf16_runtime_bert_gflops = 0;
  double bf16_fixed_decoder_gflops = 0, bf16_runtime_decoder_gflops = 0;
  std::vector<row> rows;
};

struct triad_report {
  double streaming_gbps = 0; // a = b + s*c, non-temporal stores
  double in_place_gbps = 0;  // a = a + s*c
};

// Medians over the rounds; the ratio is the median of each round's Adam / bound.
struct adam_report {
  int rounds = 0;
  double triad_streaming_gbps = 0, triad_in_place_gbps = 0;
  double triad_gbps = 0; // the faster of the two: the bound
  double params_per_s = 0;
  double bound_params_per_s = 0;
  double ratio_to_bound = 0, ratio_min = 0, ratio_max = 0;
};

struct bert_step_report {
  int batch = 0, seq = 0;
  double seconds = 0; // best fwd+bwd step time
  double gflops = 0;  // model FLOPs (6 x params-in-GEMMs x tokens + attention) per second
};

gemm_report bench_gemm(const bench_sizes& sizes);
adam_report bench_adam(const bench_sizes& sizes);
// One BERT-mini forward+backward (batch 32, seq 128; smaller with quick sizes), with working
// weights and stashed activations in `working` (f32, or bf16 as bf16.enabled keeps them).
bert_step_report bench_bert_mini_step(const bench_sizes& sizes, dtype working);

} // namespace dsa::tools
