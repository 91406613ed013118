// dsactor bench train --backend cuda: BERT pre-training steps through `dsactor run`'s actors
// on one GPU (train::run_training: feeder, stage, reducer and shard actors, a CUDA stage),
// beside the bare GPU model's step (bench gpu-train's, the same model, batch and storage)
// and the bf16 GEMM peak, all measured in this call: samples/s, model TFLOP/s, MFU, and the
// run's share of the bare step's speed (goal: at least 0.95). Twice: the optimizer on the
// GPU (offload_optimizer "none") and on the CPU shard ("cpu", ZeRO stage 1). The runs' step
// times come from their metrics.jsonl (wall_clock_breakdown), warm-up steps left out;
// their data is prepared from a made-up corpus in --work (the text does not matter).
//
// --task squad: the SQuAD fine-tuning step instead (BertForQuestionAnswering's shape, default
// seq 384, batch 32) on a made-up QA set, the optimizer on the GPU, beside PyTorch +
// HuggingFace's step of the same shape measured in the same call
// (tools/bench/bench_torch_bert.py, where torch and transformers are installed).
#include "tools/bench/bench_gpu.hpp"
#include "tools/bench/bench_train_runs.hpp"

#include "actors/train/run/trainer.hpp"
#include "kernels/cuda/cuda_allocator.hpp"
#include "tools/bench/bench_util.hpp"
#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace dsa::tools {
namespace {


// The [model] table's size lines: BERT-large or -base, or bert-6b (a BERT-shaped model of
// 6.2 billion parameters: 30 layers of hidden 4096, 32 heads, intermediate 16384).
std::string model_lines(const train_setup& b) {
  if (b.model == "bert-6b")
    return fmt::format("size = \"custom\"\nnum_layers = {}\nhidden_size = 4096\nnum_heads = 32\n"
                       "intermediate_size = 16384",
                       b.big_layers);
  return b.model == "bert-large" ? "size = \"large\"" : "size = \"base\"";
}

bert::bert_config model_config(const train_setup& b) {
  if (b.model != "bert-6b")
    return bert::bert_config_for(b.model == "bert-large" ? bert::model_size::large : bert::model_size::base);
  bert::bert_config cfg = bert::bert_config_for(bert::model_size::large);
  cfg.size = bert::model_size::custom;
  cfg.num_layers = b.big_layers;
  cfg.hidden_size = 4096;
  cfg.num_heads = 32;
  cfg.intermediate_size = 16384;
  return cfg;
}

// The runs' common part: the batch, BERT's size, AdamW at `lr`, bf16 on the GPU; `model_extra`
// goes into the [model] table.
std::string config_head(const train_setup& b, const std::string& name, const char* model_extra, double lr) {
  return fmt::format(R"(train_batch_size = {step_batch}
train_micro_batch_size_per_gpu = {batch}
train_steps = {steps}
steps_per_print = 1
wall_clock_breakdown = true
seed = 7
run_dir = "{work}/{name}"

[model]
{size}
vocab_size = 30522
max_position_embeddings = 512
{model_extra}
[optimizer]
type = "AdamW"
params = {{ lr = {lr}, weight_decay = 0.01 }}

[bf16]
enabled = true

[devices]
backend = "cuda"

)",
                     fmt::arg("batch", b.batch), fmt::arg("step_batch", b.batch * b.accumulation),
                     fmt::arg("steps", b.steps + b.warmup), fmt::arg("work", b.work),
                     fmt::arg("name", name), fmt::arg("size", model_lines(b)),
                     fmt::arg("model_extra", model_extra), fmt::arg("lr", lr));
}

std::string run_config_text(const train_setup& b, const std::string& corpus, const std::string& name) {
  return config_head(b, name, "", 1e-4) +
         prepared_data_sections(corpus, b.work, b.seq, b.work + "/" + name + "/checkpoints");
}

// The SQuAD run's config: the made-up QA set, one window per question, no dev set.
std::string squad_config_text(const train_setup& b, const std::string& qa, const std::string& name) {
  return config_head(b, name, "head = \"squad\"\n", 3e-5) + fmt::format(R"([data]
vocab = "{qa}/qa-vocab.txt"
train_file = "{qa}/qa-train.json"
max_seq_length = {seq}
doc_stride = 128
max_query_length = 64

[checkpoint]
save_final = false
)",
                                                                           fmt::arg("qa", qa), fmt::arg("seq", b.seq));
}

// PyTorch + HuggingFace's samples/s for the SQuAD shape, from the peer script's JSON line
// (the script prints its own progress, passed through).
expected<double> peer_samples_per_s(const train_setup& b, const std::string& peer) {
  if (!std::filesystem::exists(peer))
    return make_error(errc::io, "the peer script '{}' is not there (--peer)", peer);
  const std::string cmd = fmt::format("python3 '{}' --model {} --shapes squad:{}:{} --steps {} --warmup {} 2>&1", peer,
                                      b.model, b.seq, b.batch, std::max<std::int64_t>(b.steps, 3), b.warmup);
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return make_error(errc::io, "cannot run '{}'", cmd);
  std::string line, last;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe)) {
    line = buf;
    fmt::print("  peer: {}", line);
    if (line.rfind("{\"bench\": \"torch-bert\"", 0) == 0) last = line;
  }
  const int status = ::pclose(pipe);
  if (last.empty())
    return make_error(errc::unsupported, "PyTorch + HuggingFace did not run (exit status {}; its output is above)",
                      status);
  const auto row = nlohmann::json::parse(last, nullptr, false);
  if (row.is_discarded() || !row.contains("samples_per_s"))
    return make_error(errc::io, "the peer's line has no samples_per_s: {}", last);
  return row["samples_per_s"].get<double>();
}

// One `dsactor run` of the config with `overrides`: its median step time after the warm-up,
// and the median of the shards' update time (wall_clock_breakdown's step timer) into
// `update_seconds` when given.
expected<double> run_seconds(const train_setup& b, const std::string& data, const std::string& name,
                             const std::vector<std::string>& overrides, double* update_seconds = nullptr) {
  const std::string path = b.work + "/" + name + ".toml";
  std::ofstream(path) << (b.task == "squad" ? squad_config_text(b, data, name) : run_config_text(b, data, name));
  train::run_request r;
  r.config_path = path;
  r.overrides = overrides;
  if (const int rc = train::run_training(r); rc != 0)
    return make_error(errc::runtime, "the {} run failed (exit code {}); its log is above", name, rc);
  const std::string metrics = b.work + "/" + name + "/metrics.jsonl";
  std::ifstream in(metrics);
  std::vector<double> steps, updates;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (n <= b.warmup) continue;
    const auto row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_discarded() || !row.contains("Train/Samples/elapsed_time_ms_iteration"))
      return make_error(errc::io, "'{}' line {}: no Train/Samples/elapsed_time_ms_iteration", metrics, n);
    steps.push_back(row["Train/Samples/elapsed_time_ms_iteration"].get<double>() / 1e3);
    if (row.contains("Train/Samples/elapsed_time_ms_step"))
      updates.push_back(row["Train/Samples/elapsed_time_ms_step"].get<double>() / 1e3);
  }
  if (update_seconds) *update_seconds = median(updates);
  if (steps.empty()) return make_error(errc::io, "'{}': no step after the {} warm-up steps", metrics, b.warmup);
  return median(steps);
}

// --task squad: dsactor run's fine-tuning step beside PyTorch + HuggingFace's.
int bench_squad(const train_setup& b, const bert::bert_config& cfg, const std::string& peer, bool deterministic) {
  cudaStream_t stream;
  DSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double peak = bf16_gemm_peak_tflops(stream);
  DSA_CUDA_CHECK(cudaStreamDestroy(stream));
  const std::string qa = write_squad_set(b.work + "/qa", static_cast<int>(b.batch * (b.steps + b.warmup + 1)), b.seq);
  const std::vector<std::string> gpu_optimizer{"zero_optimization.stage=0",
                                               "zero_optimization.offload_optimizer.device=\"none\""};
  auto run = run_seconds(b, qa, "squad", gpu_optimizer);
  expected<double> det = make_error(errc::config, "not asked for (--deterministic)");
  if (deterministic) {
    std::vector<std::string> o = gpu_optimizer;
    o.push_back("devices.deterministic=true");
    det = run_seconds(b, qa, "squad-deterministic", o);
  }
  auto hf = peer_samples_per_s(b, peer);
  const double flops = flops_per_sample(cfg, b.seq);
  fmt::print("{} SQuAD fine-tuning (BertForQuestionAnswering), bf16, seq {} batch {}, bf16 GEMM peak {:.1f} TFLOP/s "
             "(median step of {} after {} warm-up):\n",
             b.model, b.seq, b.batch, peak, b.steps, b.warmup);
  auto line = [&](const char* what, double samples) {
    const double tflops = flops * samples / 1e12;
    fmt::print("  {:<48} {:8.1f} samples/s {:7.1f} TFLOP/s  MFU {:5.1f}%\n", what, samples, tflops,
               100 * tflops / peak);
  };
  if (run) line("dsactor run, optimizer on the GPU", static_cast<double>(b.batch) / *run);
  else fmt::print(stderr, "dsactor bench train: {}\n", run.err().to_string());
  if (deterministic && det) line("dsactor run, deterministic", static_cast<double>(b.batch) / *det);
  else if (deterministic) fmt::print(stderr, "dsactor bench train: {}\n", det.err().to_string());
  if (hf) line("PyTorch + HuggingFace (bench_torch_bert.py)", *hf);
  else fmt::print("  PyTorch + HuggingFace: not measured: {}\n", hf.err().message);
  const double ratio = run && hf ? static_cast<double>(b.batch) / *run / *hf : 0.0;
  if (run && hf) fmt::print("  dsactor run / PyTorch + HuggingFace: {:.3f}x samples/s\n", ratio);
  auto number = [](const expected<double>& v) { return v ? fmt::format("{:.5f}", *v) : std::string("null"); };
  fmt::print("{{\"bench\":\"train\",\"task\":\"squad\",\"backend\":\"cuda\",\"model\":\"{}\",\"seq\":{},\"batch\":{},"
             "\"run_step_s\":{},\"run_deterministic_step_s\":{},\"hf_samples_per_s\":{},\"run_to_hf\":{},"
             "\"bf16_peak_tflops\":{:.1f}}}\n",
             b.model, b.seq, b.batch, number(run), number(det), hf ? fmt::format("{:.2f}", *hf) : std::string("null"),
             run && hf ? fmt::format("{:.4f}", ratio) : std::string("null"), peak);
  return run && (!deterministic || det) ? 0 : 1;
}

} // namespace

bert::bert_config train_model_config(const train_setup& b) { return model_config(b); }

expected<double> train_run_seconds(const train_setup& b, const std::string& data, const std::string& name,
                                   const std::vector<std::string>& overrides, double* update_seconds) {
  return run_seconds(b, data, name, overrides, update_seconds);
}

int bench_train_main(int argc, char** argv) {
  namespace po = boost::program_options;
  po::options_description opts(
      "dsactor bench train --backend cuda [--task pretraining|squad] [--model bert-large] [--seq 128|384] "
      "[--batch 64|32] [--steps 8] [--deterministic] [--peer tools/bench/bench_torch_bert.py] [--work DIR]");
  train_setup b;
  std::string backend = "cuda";
  std::string peer = "tools/bench/bench_torch_bert.py";
  bool deterministic = false;
  opts.add_options()("help,h", "this help")("backend", po::value(&backend)->default_value(backend),
                                            "cuda (the CPU's step: dsactor bench runtime and kernels)")(
      "task", po::value(&b.task)->default_value(b.task),
      "pretraining (MLM + NSP) or squad (fine-tuning, beside PyTorch + HuggingFace)")(
      "peer", po::value(&peer)->default_value(peer), "--task squad: the PyTorch + HuggingFace script")(
      "model", po::value(&b.model)->default_value(b.model), "bert-large or bert-base")(
      "seq", po::value(&b.seq), "sequence length (at most 512; default 128, squad 384)")(
      "batch", po::value(&b.batch), "micro-batch (one per step; default 64, squad 32)")(
      "steps", po::value(&b.steps)->default_value(b.steps), "timed steps (after 2 warm-up steps)")(
      "deterministic", po::bool_switch(&deterministic),
      "also the run with the optimizer on the GPU under devices.deterministic, and its cost")(
      "work", po::value(&b.work), "folder for the data and the runs (default: a new one under /tmp)");
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "bench train")) return *done;
  if (backend != "cuda") {
    fmt::print(stderr, "dsactor bench train: --backend '{}': only cuda is measured here (the CPU's step: dsactor bench "
                       "runtime and dsactor bench kernels)\n",
               backend);
    return 2;
  }
  if (b.task != "pretraining" && b.task != "squad") {
    fmt::print(stderr, "dsactor bench train: --task '{}': expected pretraining or squad\n", b.task);
    return 2;
  }
  if (!vm.count("seq")) b.seq = b.task == "squad" ? 384 : 128;
  if (!vm.count("batch")) b.batch = b.task == "squad" ? 32 : 64;
  if ((b.model != "bert-large" && b.model != "bert-base") || b.seq < 2 || b.seq > 512 || b.batch < 1 || b.steps < 1 ||
      (b.task == "squad" && b.seq < 64)) {
    fmt::print(stderr, "dsactor bench train: --model must be bert-large or bert-base, --seq in [2, 512] (squad: at "
                       "least 64), --batch and --steps at least 1\n");
    return 2;
  }
  const cuda::device_probe probe = cuda::probe_devices();
  if (probe.count == 0) {
    fmt::print(stderr, "dsactor bench train: {}\n", probe.message);
    return 3;
  }
  if (b.work.empty()) {
    char tmpl[] = "/tmp/dsactor-bench-train-XXXXXX";
    if (!mkdtemp(tmpl)) {
      fmt::print(stderr, "dsactor bench train: cannot make a folder under /tmp\n");
      return 1;
    }
    b.work = tmpl;
  }
  std::filesystem::create_directories(b.work);
  fmt::print("{}; CPU {}; work folder {}\n", probe.message, cpu_model(), b.work);
  const bert::bert_config cfg =
      bert::bert_config_for(b.model == "bert-large" ? bert::model_size::large : bert::model_size::base);
  if (b.task == "squad") return bench_squad(b, cfg, peer, deterministic);
  cudaStream_t stream;
  DSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double peak = bf16_gemm_peak_tflops(stream);
  const bare_step bare = bare_gpu_train(cfg, b.seq, b.batch, b.steps, stream);
  DSA_CUDA_CHECK(cudaStreamDestroy(stream));

  const std::string corpus = write_corpus(b.work, 40 + static_cast<int>(b.batch * (b.steps + b.warmup) * b.seq / 400));
  auto gpu_opt = run_seconds(b, corpus, "gpu-optimizer",
                             {"zero_optimization.stage=0", "zero_optimization.offload_optimizer.device=\"none\""});
  auto cpu_opt = run_seconds(b, corpus, "cpu-optimizer",
                             {"zero_optimization.stage=1", "zero_optimization.offload_optimizer.device=\"cpu\""});
  expected<double> det = make_error(errc::config, "not asked for (--deterministic)");
  if (deterministic)
    det = run_seconds(b, corpus, "deterministic",
                      {"zero_optimization.stage=0", "zero_optimization.offload_optimizer.device=\"none\"",
                       "devices.deterministic=true"});
  const double flops = flops_per_sample(cfg, b.seq);
  auto line = [&](const char* what, double seconds) {
    const double samples = static_cast<double>(b.batch) / seconds;
    const double tflops = flops * samples / 1e12;
    fmt::print("  {:<44} {:8.4f} s/step {:8.1f} samples/s {:7.1f} TFLOP/s  MFU {:5.1f}%  {:.3f}x the bare step\n",
               what, seconds, samples, tflops, 100 * tflops / peak, bare.seconds / seconds);
  };
  fmt::print("{} pre-training, bf16, seq {} batch {}, bf16 GEMM peak {:.1f} TFLOP/s (median step of {} after {} "
             "warm-up):\n",
             b.model, b.seq, b.batch, peak, b.steps, b.warmup);
  line("bare GPU model step (bench gpu-train)", bare.seconds);
  if (gpu_opt) line("dsactor run, optimizer on the GPU", *gpu_opt);
  else fmt::print(stderr, "dsactor bench train: {}\n", gpu_opt.err().to_string());
  if (cpu_opt) line("dsactor run, optimizer on the CPU shard", *cpu_opt);
  else fmt::print(stderr, "dsactor bench train: {}\n", cpu_opt.err().to_string());
  if (deterministic && det) {
    line("dsactor run, optimizer on the GPU, deterministic", *det);
    if (gpu_opt)
      fmt::print("  the deterministic mode's cost: {:.1f}% more time per step than the same run without it\n",
                 100.0 * (*det / *gpu_opt - 1.0));
  } else if (deterministic) {
    fmt::print(stderr, "dsactor bench train: {}\n", det.err().to_string());
  }
  auto number = [](const expected<double>& v) { return v ? fmt::format("{:.5f}", *v) : std::string("null"); };
  fmt::print("{{\"bench\":\"train\",\"backend\":\"cuda\",\"model\":\"{}\",\"seq\":{},\"batch\":{},\"bare_step_s\":{:.5f},"
             "\"run_gpu_optimizer_step_s\":{},\"run_cpu_optimizer_step_s\":{},\"run_deterministic_step_s\":{},"
             "\"run_to_bare\":{},\"bf16_peak_tflops\":{:.1f}}}\n",
             b.model, b.seq, b.batch, bare.seconds, number(gpu_opt), number(cpu_opt), number(det),
             gpu_opt ? fmt::format("{:.4f}", bare.seconds / *gpu_opt) : std::string("null"), peak);
  if (gpu_opt && bare.seconds / *gpu_opt < 0.95)
    fmt::print("  below the goal: dsactor run at {:.3f}x the bare step, the goal is 0.95x\n", bare.seconds / *gpu_opt);
  return gpu_opt && cpu_opt && (!deterministic || det) ? 0 : 1;
}

} // namespace dsa::tools
