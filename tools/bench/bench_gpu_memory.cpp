// dsactor bench gpu-memory: the largest micro-batch of a BERT SQuAD fine-tuning step
// (BertForQuestionAnswering's shape, bf16, the AdamW moments on the device) that fits on
// one GPU, at each sequence length with activation checkpointing off and on, beside
// PyTorch + HuggingFace's largest (tools/bench/bench_torch_bert.py --max-batch, run in the
// same call): the table DeepSpeed publishes for its transformer kernels.
//
// The search: batch 1, 2, 4, ... until a step (forward and backward of the GPU part,
// models/bert/cuda_part.hpp) runs out of device memory, then bisection between the last
// that fitted and the first that did not. A step that fails frees everything it took
// (stream-ordered frees, then a stream wait) before the next try.
#include "tools/bench/bench_gpu.hpp"

#include "kernels/cuda/cuda_allocator.hpp"
#include "models/bert/cuda_part.hpp"
#include "tools/bench/bench_util.hpp"
#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>
#include <random>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

namespace dsa::tools {
namespace {

// A SQuAD batch of B sequences of T tokens: random ids, two segments, every token attending,
// span labels inside the window.
bert::bert_batch squad_batch(const bert::bert_config& cfg, std::int64_t B, std::int64_t T) {
  std::mt19937 gen(5);
  std::uniform_int_distribution<std::int32_t> word(1, static_cast<std::int32_t>(cfg.vocab_size - 1));
  std::uniform_int_distribution<std::int32_t> position(0, static_cast<std::int32_t>(T - 1));
  bert::bert_batch b;
  b.input_ids = tensor::empty({B, T}, dtype::i32);
  b.token_type_ids = tensor::empty({B, T}, dtype::i32);
  b.start_positions = tensor::empty({B}, dtype::i32);
  b.end_positions = tensor::empty({B}, dtype::i32);
  for (std::int64_t i = 0; i < B * T; ++i) {
    b.input_ids.data<std::int32_t>()[i] = word(gen);
    b.token_type_ids.data<std::int32_t>()[i] = i % T < T / 4 ? 0 : 1;
  }
  for (std::int64_t s = 0; s < B; ++s) {
    const std::int32_t a = position(gen), c = position(gen);
    b.start_positions.data<std::int32_t>()[s] = std::min(a, c);
    b.end_positions.data<std::int32_t>()[s] = std::max(a, c);
  }
  return b;
}

// Whether one training step at batch B fits: true, false on running out of device memory;
// any other failure is thrown.
bool step_fits(bert::gpu::part& gpu, const bert::bert_config& cfg, std::int64_t B, std::int64_t T) {
  const bert::bert_batch batch = squad_batch(cfg, B, T);
  bert::forward_context ctx;
  ctx.seed = 1;
  bool fits = true;
  try {
    bert::gpu::part_stash stash;
    (void)gpu.forward(bert::gpu::device_array(), batch, ctx, 1.0f, stash);
    (void)gpu.backward(nullptr, stash);
  } catch (const std::runtime_error& e) {
    if (std::string_view(e.what()).find("GPU memory:") == std::string_view::npos) throw;
    fits = false;
  }
  DSA_CUDA_CHECK(cudaStreamSynchronize(gpu.stream()));
  gpu.zero_gradients();
  return fits;
}

// The largest batch in [1, limit] whose step fits (0: not even one sequence).
std::int64_t largest_batch(bert::gpu::part& gpu, const bert::bert_config& cfg, std::int64_t T, std::int64_t limit) {
  std::int64_t ok = 0, bad = limit + 1;
  for (std::int64_t b = 1; b <= limit; b *= 2) {
    if (!step_fits(gpu, cfg, b, T)) {
      bad = b;
      break;
    }
    ok = b;
  }
  while (bad - ok > 1) {
    const std::int64_t mid = ok + (bad - ok) / 2;
    (step_fits(gpu, cfg, mid, T) ? ok : bad) = mid;
  }
  return ok;
}

// PyTorch + HuggingFace's largest batches by (seq, checkpointing), from the peer's JSON lines.
std::map<std::pair<std::int64_t, bool>, std::int64_t> peer_largest(const std::string& peer, const std::string& model,
                                                                   const std::vector<std::int64_t>& seqs,
                                                                   std::string& why) {
  std::map<std::pair<std::int64_t, bool>, std::int64_t> out;
  if (!std::filesystem::exists(peer)) {
    why = fmt::format("the peer script '{}' is not there (--peer)", peer);
    return out;
  }
  std::string list;
  for (std::int64_t s : seqs)
    list += (list.empty() ? "" : ",") + std::to_string(s);
  const std::string cmd = fmt::format("python3 '{}' --model {} --max-batch {} 2>&1", peer, model, list);
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) {
    why = "cannot run " + cmd;
    return out;
  }
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe)) {
    const std::string line = buf;
    fmt::print("  peer: {}", line);
    if (line.rfind("{\"bench\": \"torch-bert-max-batch\"", 0) != 0) continue;
    const auto row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_discarded()) continue;
    out[{row["seq"].get<std::int64_t>(), row["checkpointing"].get<bool>()}] = row["max_batch"].get<std::int64_t>();
  }
  const int status = ::pclose(pipe);
  if (out.empty()) why = fmt::format("PyTorch + HuggingFace did not run (exit status {}; its output is above)", status);
  return out;
}

} // namespace

int bench_gpu_memory_main(int argc, char** argv) {
  namespace po = boost::program_options;
  po::options_description opts(
      "dsactor bench gpu-memory [--model bert-large] [--seqs 384,512] [--limit 1024] [--peer tools/bench/bench_torch_bert.py]");
  std::string model = "bert-large", seqs_text = "384,512", peer = "tools/bench/bench_torch_bert.py";
  std::int64_t limit = 1024;
  opts.add_options()("help,h", "this help")("model", po::value(&model)->default_value(model), "bert-large or bert-base")(
      "seqs", po::value(&seqs_text)->default_value(seqs_text), "sequence lengths, comma-separated (each at most 512)")(
      "limit", po::value(&limit)->default_value(limit), "the largest batch tried")(
      "peer", po::value(&peer)->default_value(peer), "the PyTorch + HuggingFace script");
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "bench gpu-memory")) return *done;
  std::vector<std::int64_t> seqs;
  {
    std::stringstream in(seqs_text);
    std::string item;
    while (std::getline(in, item, ',')) {
      char* end = nullptr;
      const long long v = std::strtoll(item.c_str(), &end, 10);
      if (item.empty() || *end || v < 2 || v > 512) {
        fmt::print(stderr, "dsactor bench gpu-memory: --seqs '{}': expected lengths in [2, 512], comma-separated\n",
                   seqs_text);
        return 2;
      }
      seqs.push_back(v);
    }
  }
  if ((model != "bert-large" && model != "bert-base") || limit < 1) {
    fmt::print(stderr, "dsactor bench gpu-memory: --model must be bert-large or bert-base and --limit at least 1\n");
    return 2;
  }
  const cuda::device_probe probe = cuda::probe_devices();
  if (probe.count == 0) {
    fmt::print(stderr, "dsactor bench gpu-memory: {}\n", probe.message);
    return 3;
  }
  fmt::print("{}; CPU {}\n", probe.message, cpu_model());
  bert::bert_config cfg = bert::bert_config_for(model == "bert-large" ? bert::model_size::large : bert::model_size::base);
  cfg.head = bert::head_kind::squad;
  cudaStream_t stream;
  DSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::map<std::pair<std::int64_t, bool>, std::int64_t> ours;
  for (const bool checkpointing : {false, true}) {
    bert::bert_config c = cfg;
    c.checkpoint_activations = checkpointing;
    bert::bert_parameters params(c, bert::bert_range::whole(c));
    params.init(1);
    auto gpu = std::make_unique<bert::gpu::part>(params, cuda::elem::bf16, stream);
    cpu::adam_params adam; // one step, so the AdamW moments hold their device memory
    adam.lr = 1e-5f;
    adam.step = 1;
    gpu->optimizer_step(adam);
    for (std::int64_t T : seqs) {
      ours[{T, checkpointing}] = largest_batch(*gpu, c, T, limit);
      fmt::print("  dsactor: seq {} checkpointing {}: largest micro-batch {}\n", T, checkpointing ? "on" : "off",
                 ours[{T, checkpointing}]);
    }
    gpu.reset();
    DSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  DSA_CUDA_CHECK(cudaStreamDestroy(stream));
  std::string why;
  const auto theirs = peer_largest(peer, model, seqs, why);
  fmt::print("{} SQuAD fine-tuning step (bf16, AdamW moments on the device), the largest micro-batch that fits:\n",
             model);
  fmt::print("  {:>5} {:>14} {:>9} {:>24}\n", "seq", "checkpointing", "dsactor", "PyTorch + HuggingFace");
  std::string rows;
  for (std::int64_t T : seqs)
    for (const bool checkpointing : {false, true}) {
      const auto it = theirs.find({T, checkpointing});
      const std::int64_t mine = ours[{T, checkpointing}];
      fmt::print("  {:>5} {:>14} {:>9} {:>24}\n", T, checkpointing ? "on" : "off", mine,
                 it == theirs.end() ? std::string("-") : std::to_string(it->second));
      rows += fmt::format("{}{{\"seq\":{},\"checkpointing\":{},\"dsactor\":{},\"hf\":{}}}", rows.empty() ? "" : ",", T,
                          checkpointing, mine, it == theirs.end() ? std::string("null") : std::to_string(it->second));
    }
  if (theirs.empty()) fmt::print("  PyTorch + HuggingFace: not measured: {}\n", why);
  fmt::print("{{\"bench\":\"gpu-memory\",\"model\":\"{}\",\"rows\":[{}]}}\n", model, rows);
  return 0;
}

} // namespace dsa::tools
