// dsactor bench offload DIR --backend cuda (and --model bert-6b): the optimizer on the GPU,
// on the CPU shard and on NVMe, through `dsactor run` on one GPU (bench_train_runs.hpp).
#include "tools/bench/bench_gpu.hpp"
#include "tools/bench/bench_train_runs.hpp"

#include "kernels/cuda/cuda_allocator.hpp"
#include "models/bert/parameter_specs.hpp"
#include "tools/bench/bench_util.hpp"
#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace dsa::tools {
namespace {

// The host link's rate with pinned memory, each way: the median of 5 copies of 256 MiB, in
// bytes per second (host to device, device to host).
std::pair<double, double> pinned_link_rates() {
  constexpr std::size_t bytes = std::size_t{256} << 20;
  void* host = nullptr;
  void* dev = nullptr;
  DSA_CUDA_CHECK(cudaMallocHost(&host, bytes));
  DSA_CUDA_CHECK(cudaMalloc(&dev, bytes));
  std::memset(host, 1, bytes);
  cudaEvent_t start, stop;
  DSA_CUDA_CHECK(cudaEventCreate(&start));
  DSA_CUDA_CHECK(cudaEventCreate(&stop));
  auto rate = [&](cudaMemcpyKind kind) {
    std::vector<double> r;
    for (int i = 0; i < 5; ++i) {
      DSA_CUDA_CHECK(cudaEventRecord(start));
      DSA_CUDA_CHECK(kind == cudaMemcpyHostToDevice ? cudaMemcpy(dev, host, bytes, kind) : cudaMemcpy(host, dev, bytes, kind));
      DSA_CUDA_CHECK(cudaEventRecord(stop));
      DSA_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      DSA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      r.push_back(static_cast<double>(bytes) / (static_cast<double>(ms) / 1e3));
    }
    return median(r);
  };
  const std::pair<double, double> rates{rate(cudaMemcpyHostToDevice), rate(cudaMemcpyDeviceToHost)};
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(dev);
  cudaFreeHost(host);
  return rates;
}

// --model bert-6b: a model whose model states (16 bytes per parameter) pass the GPU's
// memory, trained with the optimizer on the CPU shard (the GPU keeps 6 bytes per parameter
// and the activations); its step's TFLOP/s and MFU against the bf16 peak measured here
// (goal: at least 35%). The optimizer on the GPU would not fit, and the NVMe case needs more
// disk than a 64 GiB machine has (12 bytes per parameter), so neither runs.
std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

int bench_big_offload(const train_setup& b, const bert::bert_config& cfg, const std::string& corpus, double peak,
                      const std::vector<std::string>& common) {
  std::int64_t params = 0;
  for (const auto& spec : bert::parameter_specs(cfg, bert::bert_range::whole(cfg))) params += shape_numel(spec.shape);
  std::size_t free = 0, total = 0;
  DSA_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  const double states = 16.0 * static_cast<double>(params);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  fmt::print("bert-6b ({} layers): {:.2f}B parameters, model states {:.1f} GB = {:.2f}x the GPU's {:.1f} GB; host "
             "memory needed about {:.1f} GB (22 bytes per parameter) of the machine's {:.1f} GB\n",
             cfg.num_layers, static_cast<double>(params) / 1e9, states / 1e9, states / static_cast<double>(total),
             static_cast<double>(total) / 1e9, 22.0 * static_cast<double>(params) / 1e9,
             static_cast<double>(pages) * static_cast<double>(page) / 1e9);
  double update = 0;
  // No held-out documents, so no end-of-run evaluation: it would assemble the whole model
  // beside the training's states (8 more bytes per parameter).
  auto cpu = train_run_seconds(b, corpus, "offload-cpu-6b",
                         with(common, {"zero_optimization.stage=1", "zero_optimization.offload_optimizer.device=\"cpu\"",
                                       "data.prepare.holdout_docs=0"}),
                         &update);
  const std::int64_t sequences = b.batch * b.accumulation;
  if (!cpu) {
    fmt::print(stderr, "dsactor bench offload: {}\n", cpu.err().to_string());
    return 1;
  }
  const double tflops = flops_per_sample(cfg, b.seq) * static_cast<double>(sequences) / *cpu / 1e12;
  fmt::print("bert-6b pre-training, bf16, seq {}, micro-batch {} x {} accumulation ({} sequences a step), the "
             "optimizer on the CPU: {:.3f} s/step, {:.1f} TFLOP/s, MFU {:.1f}% of the bf16 GEMM peak {:.1f} TFLOP/s "
             "(update {:.3f} s; goal: MFU at least 35%)\n",
             b.seq, b.batch, b.accumulation, sequences, *cpu, tflops, 100 * tflops / peak, peak, update);
  fmt::print("{{\"bench\":\"offload\",\"backend\":\"cuda\",\"model\":\"bert-6b\",\"layers\":{},\"params\":{},\"states_to_gpu\":{:.3f},"
             "\"cpu_step_s\":{:.4f},\"tflops\":{:.1f},\"mfu\":{:.4f},\"bf16_peak_tflops\":{:.1f}}}\n",
             cfg.num_layers, params, states / static_cast<double>(total), *cpu, tflops, tflops / peak, peak);
  return 0;
}

} // namespace

// dsactor bench offload DIR --backend cuda: the same BERT pre-training step through `dsactor
// run` on one GPU with the optimizer on the GPU, offloaded to the CPU shard (ZeRO-Offload) and
// to NVMe in DIR (ZeRO-Infinity: the update streams over the backward as each part's
// gradients land), in one call; each offloaded step against the GPU's (goal: the CPU one
// within 1.3x) and which resource bounds it: the host link (4 bytes per parameter down, the
// working precision's up, at the pinned rates measured here), the CPU update (the shard's
// step timer) or, for NVMe, the disk (its update time beyond the CPU run's).
int bench_offload_cuda_main(int argc, char** argv) {
  namespace po = boost::program_options;
  po::options_description opts("dsactor bench offload DIR --backend cuda [--model bert-large|bert-base|bert-6b] "
                               "[--seq 128] [--batch 64] [--accumulation 4] [--steps 4] [--clip 0] [--bucket 2e7] "
                               "[--speculative]");
  train_setup b;
  b.batch = 64;
  b.accumulation = 4;
  b.steps = 4;
  std::string backend;
  double clip = 0.0, bucket = 2e7;
  opts.add_options()("help,h", "this help")("dir", po::value<std::string>()->required(),
                                            "a folder on the NVMe device (the work folder and the swap go there)")(
      "backend", po::value(&backend), "cuda")(
      "model", po::value(&b.model)->default_value(b.model),
      "bert-large, bert-base, or bert-6b (6.2B parameters, the optimizer on the CPU only: micro-batch 8 x 64 "
      "accumulation by default, TFLOP/s and MFU; its model states pass an 80 GB GPU's memory)")(
      "seq", po::value(&b.seq)->default_value(b.seq), "sequence length")(
      "batch", po::value(&b.batch)->default_value(b.batch), "micro-batch")(
      "accumulation", po::value(&b.accumulation)->default_value(b.accumulation), "micro-batches per step")(
      "steps", po::value(&b.steps)->default_value(b.steps), "timed steps (after 2 warm-up steps)")(
      "layers", po::value(&b.big_layers)->default_value(b.big_layers),
      "bert-6b's layers (30: 6.2B parameters; each layer is 201M)")(
      "clip", po::value(&clip)->default_value(clip),
      "gradient_clipping of every run (0: none, so the offloaded updates stream over the backward)")(
      "bucket", po::value(&bucket)->default_value(bucket),
      "zero_optimization.reduce_bucket_size of every run: the parts of the CPU-offloaded update's stream (the "
      "NVMe stream's are sub_group_size / 4)")(
      "speculative", "pipeline.speculative_update in every run: with --clip > 0 the CPU-offloaded update still streams "
                     "(a copy of each parameter's state, taken back when the norm clips)");
  po::positional_options_description pos;
  pos.add("dir", 1);
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "bench offload", "", &pos)) return *done;
  const bool big = b.model == "bert-6b";
  if (big) { // the shape: 512 sequences a step
    if (vm["batch"].defaulted()) b.batch = 8;
    if (vm["accumulation"].defaulted()) b.accumulation = 64;
    if (vm["steps"].defaulted()) b.steps = 2;
    b.warmup = 1;
  }
  if ((b.model != "bert-large" && b.model != "bert-base" && !big) || b.seq < 2 || b.seq > 512 || b.batch < 1 ||
      b.accumulation < 1 || b.steps < 1 || b.big_layers < 1) {
    fmt::print(stderr, "dsactor bench offload: --model must be bert-large, bert-base or bert-6b, --seq in [2, 512], "
                       "--batch, --accumulation and --steps at least 1\n");
    return 2;
  }
  const cuda::device_probe probe = cuda::probe_devices();
  if (probe.count == 0) {
    fmt::print(stderr, "dsactor bench offload: {}\n", probe.message);
    return 3;
  }
  if (backend != "cuda") {
    fmt::print(stderr, "dsactor bench offload: --backend '{}': expected cuda here\n", backend);
    return 2;
  }
  b.work = vm["dir"].as<std::string>() + "/bench-offload-cuda";
  std::filesystem::create_directories(b.work);
  const bert::bert_config cfg = train_model_config(b);
  cudaStream_t stream;
  DSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double peak = bf16_gemm_peak_tflops(stream);
  DSA_CUDA_CHECK(cudaStreamDestroy(stream));
  const auto [up, down] = pinned_link_rates();
  fmt::print("{}; CPU {}; work folder {}; host link with pinned memory: {:.1f} GB/s to the GPU, {:.1f} GB/s back\n",
             probe.message, cpu_model(), b.work, up / 1e9, down / 1e9);
  const std::int64_t sequences = b.batch * b.accumulation;
  const std::string corpus = write_corpus(b.work, 40 + static_cast<int>(sequences * (b.steps + b.warmup) * b.seq / 400));
  // Both keys in every run, so the three steps differ only in where the optimizer lives.
  std::vector<std::string> common{fmt::format("gradient_clipping={}", clip),
                                  fmt::format("zero_optimization.reduce_bucket_size={}", static_cast<std::int64_t>(bucket))};
  if (vm.count("speculative")) common.push_back("pipeline.speculative_update=true");
  fmt::print("every run: {}\n", fmt::join(common, ", "));
  if (big) return bench_big_offload(b, cfg, corpus, peak, common);
  double gpu_update = 0, cpu_update = 0, nvme_update = 0;
  auto gpu = train_run_seconds(b, corpus, "offload-none",
                               with(common, {"zero_optimization.stage=0",
                                             "zero_optimization.offload_optimizer.device=\"none\""}),
                               &gpu_update);
  auto cpu = train_run_seconds(b, corpus, "offload-cpu",
                               with(common, {"zero_optimization.stage=1",
                                             "zero_optimization.offload_optimizer.device=\"cpu\""}),
                               &cpu_update);
  auto nvme = train_run_seconds(b, corpus, "offload-nvme",
                                with(common, {"zero_optimization.stage=1",
                                              "zero_optimization.offload_optimizer.device=\"nvme\"",
                                              fmt::format("zero_optimization.offload_optimizer.nvme_path=\"{}/swap\"",
                                                          b.work),
                                              "zero_optimization.offload_optimizer.pipeline_read=true",
                                              "zero_optimization.offload_optimizer.pipeline_write=true"}),
                                &nvme_update);
  const double flops = flops_per_sample(cfg, b.seq);
  fmt::print("{} pre-training, bf16, seq {}, micro-batch {} x {} accumulation ({} sequences a step), bf16 GEMM peak "
             "{:.1f} TFLOP/s (median step of {} after {} warm-up):\n",
             b.model, b.seq, b.batch, b.accumulation, sequences, peak, b.steps, b.warmup);
  auto line = [&](const char* what, const expected<double>& s, double update) {
    if (!s) {
      fmt::print("  {:<36} failed: {}\n", what, s.err().to_string());
      return;
    }
    const double samples = static_cast<double>(sequences) / *s;
    const double tflops = flops * samples / 1e12;
    fmt::print("  {:<36} {:8.3f} s/step {:8.1f} samples/s {:7.1f} TFLOP/s  MFU {:5.1f}%  update {:.3f} s{}\n", what, *s,
               samples, tflops, 100 * tflops / peak, update,
               gpu && &s != &gpu ? fmt::format("  {:.3f}x the GPU optimizer's step", *s / *gpu) : std::string());
  };
  line("optimizer on the GPU", gpu, gpu_update);
  line("optimizer offloaded to the CPU", cpu, cpu_update);
  line("optimizer offloaded to NVMe", nvme, nvme_update);
  // What each resource would take alone for one step of the offloaded runs: the f32
  // gradients down, the new version up (bf16 matrices and tables, f32 vectors).
  double down_bytes = 0, up_bytes = 0;
  for (const auto& spec : bert::parameter_specs(cfg, bert::bert_range::whole(cfg))) {
    const auto n = static_cast<double>(shape_numel(spec.shape));
    down_bytes += 4 * n;
    up_bytes += (spec.shape.size() == 2 ? 2 : 4) * n;
  }
  const double link = down_bytes / down + up_bytes / up;
  auto bound = [&](const char* what, double extra, double update, double disk) {
    const char* name = "the host link";
    double most = link;
    if (update > most) { name = "the CPU update"; most = update; }
    if (disk > most) { name = "the disk"; most = disk; }
    fmt::print("  {}: {:.3f} s beyond the GPU step; the host link alone {:.3f} s, the CPU update {:.3f} s{}: bound by "
               "{}\n",
               what, extra, link, update, disk > 0 ? fmt::format(", the disk's share {:.3f} s", disk) : std::string(),
               name);
  };
  if (gpu && cpu) bound("CPU offload", *cpu - *gpu, cpu_update, 0);
  if (gpu && nvme) bound("NVMe offload", *nvme - *gpu, cpu_update, std::max(0.0, nvme_update - cpu_update));
  if (gpu && cpu && *cpu / *gpu > 1.3)
    fmt::print("  below the goal: the CPU-offloaded step is {:.3f}x the GPU optimizer's, the goal is 1.3x\n", *cpu / *gpu);
  auto number = [](const expected<double>& v) { return v ? fmt::format("{:.5f}", *v) : std::string("null"); };
  fmt::print("{{\"bench\":\"offload\",\"backend\":\"cuda\",\"model\":\"{}\",\"seq\":{},\"micro_batch\":{},"
             "\"accumulation\":{},\"gpu_step_s\":{},\"cpu_step_s\":{},\"nvme_step_s\":{},\"cpu_to_gpu\":{},"
             "\"nvme_to_gpu\":{},\"link_h2d_gbps\":{:.2f},\"link_d2h_gbps\":{:.2f},\"bf16_peak_tflops\":{:.1f}}}\n",
             b.model, b.seq, b.batch, b.accumulation, number(gpu), number(cpu), number(nvme),
             gpu && cpu ? fmt::format("{:.4f}", *cpu / *gpu) : std::string("null"),
             gpu && nvme ? fmt::format("{:.4f}", *nvme / *gpu) : std::string("null"), up / 1e9, down / 1e9, peak);
  return gpu && cpu && nvme ? 0 : 1;
}

} // namespace dsa::tools
