// dsactor bench gpu-train: whole BERT pre-training steps on one GPU (models/bert/
// cuda_model.hpp: forward, backward, fused AdamW, bf16 storage), samples/s and model
// TFLOP/s against the bf16 GEMM peak measured in the same run (cuBLASLt, 8192^3).
// tools/bench/bench_torch_bert.py times the same steps in PyTorch + HuggingFace (the peer).
#include "tools/bench/bench_gpu.hpp"

#include "kernels/cuda/cuda_allocator.hpp"
#include "kernels/cuda/gemm.hpp"
#include "models/bert/bert_part.hpp"
#include "models/bert/cuda_model.hpp"
#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <vector>

namespace dsa::tools {
namespace {

// A synthetic pre-training batch: ids in [1, vocab), two segments, every token attending,
// 15% of positions (at least 1, never position 0) masked, random NSP labels.
bert::bert_batch synthetic_batch(const bert::bert_config& cfg, std::int64_t B, std::int64_t T,
                                 std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int32_t> word(1, static_cast<std::int32_t>(cfg.vocab_size - 1));
  bert::bert_batch b;
  b.input_ids = tensor::empty({B, T}, dtype::i32);
  b.token_type_ids = tensor::empty({B, T}, dtype::i32);
  const std::int64_t P = std::max<std::int64_t>(1, (T * 15 + 99) / 100);
  b.masked_lm_positions = tensor::empty({B, P}, dtype::i32);
  b.masked_lm_ids = tensor::empty({B, P}, dtype::i32);
  b.next_sentence_labels = tensor::empty({B}, dtype::i32);
  std::vector<std::int32_t> positions(static_cast<std::size_t>(T - 1));
  for (std::int64_t s = 0; s < B; ++s) {
    for (std::int64_t t = 0; t < T; ++t) {
      b.input_ids.data<std::int32_t>()[s * T + t] = word(gen);
      b.token_type_ids.data<std::int32_t>()[s * T + t] = t < T / 2 ? 0 : 1;
    }
    for (std::size_t i = 0; i < positions.size(); ++i)
      positions[i] = static_cast<std::int32_t>(i + 1);
    std::shuffle(positions.begin(), positions.end(), gen);
    for (std::int64_t j = 0; j < P; ++j) {
      b.masked_lm_positions.data<std::int32_t>()[s * P + j] = positions[static_cast<std::size_t>(j)];
      b.masked_lm_ids.data<std::int32_t>()[s * P + j] = word(gen);
    }
    b.next_sentence_labels.data<std::int32_t>()[s] = static_cast<std::int32_t>(gen() % 2);
  }
  return b;
}

} // namespace

// Model FLOPs per sample, as tools/bench/bench_torch_bert.py counts them (3x the forward's
// products: the layers' 4H^2 + 2HI and attention's 2TH per token, plus the decoder HV).
double flops_per_sample(const bert::bert_config& cfg, std::int64_t T) {
  const double h = static_cast<double>(cfg.hidden_size), i = static_cast<double>(cfg.intermediate_size),
               l = static_cast<double>(cfg.num_layers), v = static_cast<double>(cfg.vocab_size);
  const double per_token = l * (2.0 * (4.0 * h * h + 2.0 * h * i) + 4.0 * static_cast<double>(T) * h) + 2.0 * h * v;
  return 3.0 * per_token * static_cast<double>(T);
}

bare_step bare_gpu_train(const bert::bert_config& cfg, std::int64_t seq, std::int64_t batch, std::int64_t steps,
                         cudaStream_t stream) {
  bert::bert_parameters params(cfg, bert::bert_range::whole(cfg));
  params.init(1);
  auto model_ptr = std::make_unique<bert::gpu::pretraining_model>(params, cuda::elem::bf16, stream);
  bert::gpu::pretraining_model& gpu = *model_ptr;
  const bert::bert_batch b = synthetic_batch(cfg, batch, seq, 2);
  cpu::adam_params adam;
  adam.lr = 1e-4f;
  adam.weight_decay = 0.01f;
  bert::forward_context ctx;
  ctx.seed = 3;
  bert::bert_losses losses;
  auto one_step = [&](std::uint32_t step) {
    ctx.step = step;
    losses = gpu.step(b, ctx, 1.0f);
    adam.step = step + 1;
    gpu.optimizer_step(adam);
  };
  for (std::uint32_t s = 0; s < 2; ++s)
    one_step(s);
  DSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t s = 0; s < steps; ++s)
    one_step(static_cast<std::uint32_t>(2 + s));
  DSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  bare_step out;
  out.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / static_cast<double>(steps);
  out.loss = losses.total;
  out.parameters = gpu.parameter_count();
  model_ptr.reset(); // its arrays go back to the pool on the stream
  DSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

int bench_gpu_train_main(int argc, char** argv) {
  namespace po = boost::program_options;
  po::options_description opts("dsactor bench gpu-train [--model bert-large] [--seq 128] [--batch 64] [--steps 10]");
  std::string model = "bert-large";
  std::int64_t seq = 128, batch = 64, steps = 10;
  opts.add_options()("help,h", "this help")("model", po::value(&model)->default_value(model), "bert-large or bert-base")(
      "seq", po::value(&seq)->default_value(seq), "sequence length (at most 512)")(
      "batch", po::value(&batch)->default_value(batch), "micro-batch")(
      "steps", po::value(&steps)->default_value(steps), "timed steps (after 2 warm-up steps)");
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "bench gpu-train")) return *done;
  if (model != "bert-large" && model != "bert-base") {
    fmt::print(stderr, "dsactor bench gpu-train: --model '{}': expected bert-large or bert-base\n", model);
    return 2;
  }
  if (seq < 2 || seq > 512 || batch < 1 || steps < 1) {
    fmt::print(stderr, "dsactor bench gpu-train: --seq must be in [2, 512], --batch and --steps at least 1\n");
    return 2;
  }
  const cuda::device_probe probe = cuda::probe_devices();
  if (probe.count == 0) {
    fmt::print(stderr, "dsactor bench gpu-train: {}\n", probe.message);
    return 3;
  }
  fmt::print("{}\n", probe.message);
  bert::bert_config cfg = bert::bert_config_for(model == "bert-large" ? bert::model_size::large : bert::model_size::base);
  cudaStream_t stream;
  DSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double peak = bf16_gemm_peak_tflops(stream);
  const bare_step bare = bare_gpu_train(cfg, seq, batch, steps, stream);
  const double samples = static_cast<double>(batch) / bare.seconds;
  const double tflops = flops_per_sample(cfg, seq) * samples / 1e12;
  fmt::print("{} pre-training, bf16, seq {} batch {}: {:.4f} s/step, {:.1f} samples/s, {:.1f} TFLOP/s, "
             "MFU {:.1f}% of {:.1f} (loss {:.4f}, {} parameters)\n",
             model, seq, batch, bare.seconds, samples, tflops, 100 * tflops / peak, peak, bare.loss, bare.parameters);
  fmt::print("{{\"bench\":\"gpu-train\",\"model\":\"{}\",\"seq\":{},\"batch\":{},\"step_s\":{:.5f},"
             "\"samples_per_s\":{:.2f},\"model_tflops\":{:.1f},\"mfu\":{:.4f},\"bf16_peak_tflops\":{:.1f},"
             "\"loss\":{:.4f}}}\n",
             model, seq, batch, bare.seconds, samples, tflops, tflops / peak, peak, bare.loss);
  DSA_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

} // namespace dsa::tools
