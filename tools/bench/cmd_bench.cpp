// dsactor bench: benchmarks that validate, time, and print a ratio against a
// peer or a physical limit measured in the same run.
#include "kernels/cpu/gemm_bf16.hpp"
#include "kernels/cpu/isa.hpp"
#include "tools/bench/bench_aio.hpp"
#include "tools/bench/bench_allreduce.hpp"
#if DSA_HAVE_CUDA
#include "tools/bench/bench_gpu.hpp"
#endif
#include "tools/bench/bench_kernels.hpp"
#include "tools/bench/bench_memory.hpp"
#include "tools/bench/bench_compressed.hpp"
#include "tools/bench/bench_offload.hpp"
#include "tools/bench/bench_pipeline.hpp"
#include "tools/bench/bench_runtime.hpp"
#include "tools/command.hpp"

#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <cstring>
#include <vector>

namespace dsa::tools {
namespace {

int bench_kernels_main(int argc, char** argv) {
  namespace po = boost::program_options;
  po::options_description opts("dsactor bench kernels [--quick]");
  opts.add_options()("help,h", "this help")("quick", "small sizes (a smoke run; ratios are less meaningful)");
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "bench kernels")) return *done;
  bench_sizes sizes;
  if (vm.count("quick")) {
    sizes.square = {256, 512};
    sizes.tokens = 256;
    sizes.stream_elements = 1 << 22;
    sizes.adam_params = 1 << 21;
    sizes.reps = 1;
    sizes.adam_rounds = 1;
  }
  fmt::print("GEMM (OpenBLAS f32)\n");
  gemm_report g = bench_gemm(sizes);
  fmt::print("  {:<40} {:>9.1f} GFLOP/s (best square size: the peak)\n", "square", g.peak_gflops);
  for (const auto& r : g.rows)
    fmt::print("  {:<40} {:>9.1f} GFLOP/s  {:>5.1f}% of peak\n", r.name, r.gflops, 100 * r.gflops / g.peak_gflops);
  fmt::print("  {:<40} {:>9.1f} GFLOP/s  {:>5.1f}% of peak\n", "BERT-base shapes (flop-weighted)", g.bert_gflops,
             100 * g.bert_gflops / g.peak_gflops);
  std::string bf16_why;
  const bool bf16 = cpu::bf16_gemm_supported(&bf16_why);
  if (bf16) {
    fmt::print("GEMM (bf16 operands through oneDNN {}, rounding from f32 included)\n", cpu::bf16_gemm_implementation());
    for (const auto& r : g.rows)
      fmt::print("  {:<40} {:>9.1f} GFLOP/s  {:>5.2f}x the f32 GEMM\n", r.name, r.bf16_gflops, r.bf16_gflops / r.gflops);
    fmt::print("  {:<40} {:>9.1f} GFLOP/s  {:>5.2f}x the f32 GEMM\n", "BERT-base shapes (flop-weighted)",
               g.bf16_bert_gflops, g.bf16_bert_gflops / g.bert_gflops);
    fmt::print("  oneDNN primitives for fixed shapes vs shapes at run time (chosen: {}):\n",
               cpu::bf16_gemm_runtime_shapes() ? "at run time" : "fixed");
    fmt::print("  {:<40} {:>9.1f} vs {:.1f} GFLOP/s ({:.2f}x)\n", "BERT-base shapes (flop-weighted)",
               g.bf16_fixed_bert_gflops, g.bf16_runtime_bert_gflops, g.bf16_runtime_bert_gflops / g.bf16_fixed_bert_gflops);
    fmt::print("  {:<40} {:>9.1f} vs {:.1f} GFLOP/s ({:.2f}x)\n", "MLM decoder (150 x 256) * (8000 x 256)^T",
               g.bf16_fixed_decoder_gflops, g.bf16_runtime_decoder_gflops,
               g.bf16_runtime_decoder_gflops / g.bf16_fixed_decoder_gflops);
  } else {
    fmt::print("GEMM (bf16): not measured ({})\n", bf16_why);
  }
  adam_report a = bench_adam(sizes);
  fmt::print("Adam (fused, f32)\n");
  fmt::print("  triad bandwidth {:.1f} GB/s (streaming stores {:.1f}, in place {:.1f}) -> bound {:.3g} params/s "
             "at 28 B/param (medians of {} rounds)\n",
             a.triad_gbps, a.triad_streaming_gbps, a.triad_in_place_gbps, a.bound_params_per_s, a.rounds);
  fmt::print("  adam            {:.3g} params/s  {:.1f}% of bound (paired median; rounds {:.1f}-{:.1f}%)\n",
             a.params_per_s, 100 * a.ratio_to_bound, 100 * a.ratio_min, 100 * a.ratio_max);
  bert_step_report b = bench_bert_mini_step(sizes, dtype::f32);
  fmt::print("BERT-mini training step (batch {}, seq {}, fwd+bwd)\n", b.batch, b.seq);
  fmt::print("  {:.3f} s/step, {:.1f} model GFLOP/s, {:.1f}% of GEMM peak\n", b.seconds, b.gflops,
             100 * b.gflops / g.peak_gflops);
  bert_step_report b16;
  if (bf16) {
    cpu::bf16_operands_scope mode(true);
    b16 = bench_bert_mini_step(sizes, dtype::bf16);
    fmt::print("  bf16 (bf16 weights and stash, GEMMs on bf16 operands: bf16.enabled with bf16.cpu_gemm): {:.3f} "
               "s/step, {:.2f}x the f32 step\n", b16.seconds,
               b.seconds / b16.seconds);
  }
  auto number = [&](double x) { return bf16 ? fmt::format("{:.4g}", x) : std::string("null"); };
  fmt::print(
      "{{\"bench\":\"kernels\",\"gemm_peak_gflops\":{:.4g},\"gemm_bert_gflops\":{:.4g},\"gemm_ratio_to_peak\":{:.4f},"
      "\"triad_gbps\":{:.4g},\"adam_params_per_s\":{:.4g},\"adam_bound_params_per_s\":{:.4g},"
      "\"adam_ratio_to_bound\":{:.4f},\"bert_mini_step_s\":{:.4g},\"bert_mini_gflops\":{:.4g},"
      "\"bert_mini_ratio_to_peak\":{:.4f},\"vector_isa\":\"{}\",\"bf16_gemm_bert_gflops\":{},"
      "\"bf16_gemm_ratio_to_f32\":{},\"bf16_gemm_fixed_shapes_gflops\":{},\"bf16_gemm_runtime_shapes_gflops\":{},"
      "\"bf16_decoder_fixed_shapes_gflops\":{},\"bf16_decoder_runtime_shapes_gflops\":{},"
      "\"bert_mini_bf16_gemm_step_s\":{},\"bert_mini_bf16_gemm_speedup\":{}}}\n",
      g.peak_gflops, g.bert_gflops, g.bert_gflops / g.peak_gflops, a.triad_gbps, a.params_per_s,
      a.bound_params_per_s, a.ratio_to_bound, b.seconds, b.gflops, b.gflops / g.peak_gflops,
      cpu::isa_name(cpu::active_isa()), number(g.bf16_bert_gflops), number(g.bf16_bert_gflops / g.bert_gflops),
      number(g.bf16_fixed_bert_gflops), number(g.bf16_runtime_bert_gflops), number(g.bf16_fixed_decoder_gflops),
      number(g.bf16_runtime_decoder_gflops), number(b16.seconds), number(bf16 ? b.seconds / b16.seconds : 0.0));
  return 0;
}

} // namespace

int bench_command(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help")) {
    fmt::print("usage: dsactor bench WHAT [options]\n  kernels   GEMM, Adam and a BERT-mini step against this machine's limits\n");
    fmt::print("  runtime   the actor runtime's own overhead on BERT-mini: 1 stage vs a plain loop, trace on vs off\n");
    fmt::print("  memory    activation bytes stashed per layer for each memory-flag setting\n");
    fmt::print("  allreduce fp32 allreduce between 2 processes: dsactor over UCX vs Gloo and OpenMPI, memcpy bound\n");
    fmt::print("  pipeline  1F1B vs zero-bubble on 2 stages in 2 processes: samples/s and the measured bubble vs theory\n");
    fmt::print("  aio       sequential write+read of a file: the libaio NVMe engine vs pwrite/pread (O_DIRECT, buffered)\n");
    fmt::print("  offload   a BERT step with the optimizer state offloaded to NVMe vs in memory, and what bounds it\n");
    fmt::print("  offload --backend cuda  a GPU step with the optimizer on the GPU vs on the CPU and on NVMe\n");
    fmt::print("  compressed  1-bit Adam, 0/1 Adam, 1-bit LAMB vs AdamW and Lamb: held-out loss, bytes sent, step time\n");
    fmt::print("  gpu-kernels  CUDA kernels, cuBLASLt GEMMs and the GPU encoder layer at BERT-large shapes\n");
    fmt::print("  gpu-train    whole BERT pre-training steps on one GPU (bf16) vs the bf16 GEMM peak\n");
    fmt::print("  train --backend cuda  dsactor run's step on one GPU vs the bare model step and the GEMM peak\n");
    fmt::print("  gpu-memory   the largest SQuAD micro-batch on one GPU, checkpointing off and on, vs HuggingFace's\n");
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "kernels")) return bench_kernels_main(argc - 1, argv + 1);
  if (!std::strcmp(argv[1], "runtime")) return bench_runtime_main(argc - 1, argv + 1);
  if (!std::strcmp(argv[1], "memory")) return bench_memory_main(argc - 1, argv + 1);
  if (!std::strcmp(argv[1], "aio")) return bench_aio_main(argc - 1, argv + 1);
  if (!std::strcmp(argv[1], "offload")) {
    // --backend cuda: the GPU rank's offload (bench_train.cpp); cpu (the default): this CPU's.
    std::string backend = "cpu";
    std::vector<char*> rest; // the arguments without --backend, for the CPU's bench
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--backend" && i + 1 < argc) backend = argv[++i];
      else if (a.rfind("--backend=", 0) == 0) backend = a.substr(10);
      else rest.push_back(argv[i]);
    }
    if (backend == "cpu") return bench_offload_main(static_cast<int>(rest.size()), rest.data());
    if (backend != "cuda") {
      fmt::print(stderr, "dsactor bench offload: --backend '{}': expected cpu or cuda\n", backend);
      return 2;
    }
#if DSA_HAVE_CUDA
    return bench_offload_cuda_main(argc - 1, argv + 1);
#else
    fmt::print(stderr, "dsactor bench offload --backend cuda: this build has no CUDA (nvcc not found, or -Dcuda=disabled)\n");
    return 3;
#endif
  }
  if (!std::strcmp(argv[1], "compressed")) return bench_compressed_main(argc - 1, argv + 1);
  if (!std::strcmp(argv[1], "allreduce")) return bench_allreduce_main(argc - 1, argv + 1);
  if (!std::strcmp(argv[1], "pipeline")) return bench_pipeline_main(argc - 1, argv + 1);
  if (!std::strcmp(argv[1], "gpu-kernels")) {
#if DSA_HAVE_CUDA
    return bench_gpu_main(argc - 1, argv + 1);
#else
    fmt::print(stderr, "dsactor bench gpu-kernels: this build has no CUDA (nvcc not found, or -Dcuda=disabled)\n");
    return 3;
#endif
  }
  if (!std::strcmp(argv[1], "gpu-train")) {
#if DSA_HAVE_CUDA
    return bench_gpu_train_main(argc - 1, argv + 1);
#else
    fmt::print(stderr, "dsactor bench gpu-train: this build has no CUDA (nvcc not found, or -Dcuda=disabled)\n");
    return 3;
#endif
  }
  if (!std::strcmp(argv[1], "gpu-memory")) {
#if DSA_HAVE_CUDA
    return bench_gpu_memory_main(argc - 1, argv + 1);
#else
    fmt::print(stderr, "dsactor bench gpu-memory: this build has no CUDA (nvcc not found, or -Dcuda=disabled)\n");
    return 3;
#endif
  }
  if (!std::strcmp(argv[1], "train")) {
#if DSA_HAVE_CUDA
    return bench_train_main(argc - 1, argv + 1);
#else
    fmt::print(stderr, "dsactor bench train: this build has no CUDA (nvcc not found, or -Dcuda=disabled); the CPU's "
                       "step: dsactor bench runtime and dsactor bench kernels\n");
    return 3;
#endif
  }
  fmt::print(stderr, "dsactor bench: unknown benchmark '{}'\n", argv[1]);
  return 2;
}

} // namespace dsa::tools
