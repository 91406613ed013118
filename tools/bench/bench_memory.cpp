// dsactor bench memory: activation bytes one encoder layer stashes for backward
// under each combination of DeepSpeed's transformer memory flags
// (normalize_invertible, attn_dropout_checkpoint, gelu_checkpoint), against the
// no-flag baseline; then, per working precision (fp32, fp16, bf16), the bytes of
// the working weights (allocated for real and checked against the tensor memory
// accounting) and of the stashed activations. The stash byte counts are what the
// forward really stashes (models/bert tests check the formula against a real
// forward in each precision).
#include "tools/bench/bench_memory.hpp"

#include "core/memory_stats.hpp"
#include "models/bert/bert_parameters.hpp"
#include "models/bert/encoder_layer.hpp"

#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <string>

namespace dsa::tools {

namespace {

double mib(std::size_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

struct weights_measure {
  std::size_t bytes = 0;      // the values' nbytes
  std::int64_t accounted = 0; // what the allocation added to the CPU accounting, gradients excluded
};

// Allocates the whole model's parameters with values in `type`; f32 gradients are
// allocated too (as a stage holds them) and subtracted from the accounted bytes.
weights_measure measure_weights(const bert::bert_config& cfg, dtype type) {
  const auto before = memory_usage_of(device::cpu()).current_bytes;
  bert::bert_parameters params(cfg, bert::bert_range::whole(cfg), type);
  const auto added = memory_usage_of(device::cpu()).current_bytes - before;
  const auto grads =
      static_cast<std::int64_t>(params.count()) * static_cast<std::int64_t>(sizeof(float));
  return weights_measure{params.value_bytes(), added - grads};
}

// The per-precision table; false when the accounting disagrees with the tensors' sizes.
bool print_precisions(bert::bert_config cfg, std::int64_t B, std::int64_t T, std::string& json) {
  fmt::print("\nWorking weights (whole model) and activations stashed per layer, by precision:\n");
  fmt::print("  {:<10} {:>12} {:>8} {:>22} {:>22} {:>8}\n", "precision", "weights MiB", "ratio",
             "MiB/layer (no flags)", "MiB/layer (all flags)", "ratio");
  std::size_t base_weights = 0, base_stash = 0;
  for (dtype type : {dtype::f32, dtype::f16, dtype::bf16}) {
    const weights_measure w = measure_weights(cfg, type);
    if (w.accounted != static_cast<std::int64_t>(w.bytes)) {
      fmt::print(
          stderr,
          "dsactor bench memory: {} weights: {} bytes in the tensors, {} in the accounting\n",
          dtype_name(type), w.bytes, w.accounted);
      return false;
    }
    cfg.memory = {};
    const std::size_t plain = bert::layer_stash_bytes(cfg, B, T, bert::run_mode::train, type);
    cfg.memory = {true, true, true};
    const std::size_t all = bert::layer_stash_bytes(cfg, B, T, bert::run_mode::train, type);
    if (type == dtype::f32) {
      base_weights = w.bytes;
      base_stash = plain;
    }
    const char* name = type == dtype::f32 ? "fp32" : type == dtype::f16 ? "fp16" : "bf16";
    fmt::print("  {:<10} {:>12.2f} {:>8.3f} {:>22.2f} {:>22.2f} {:>8.3f}\n", name, mib(w.bytes),
               static_cast<double>(w.bytes) / static_cast<double>(base_weights), mib(plain),
               mib(all), static_cast<double>(plain) / static_cast<double>(base_stash));
    json += fmt::format(
        ",\"weights_bytes_{0}\":{1},\"stash_bytes_{0}\":{2},\"stash_bytes_{0}_all_flags\":{3}",
        name, w.bytes, plain, all);
  }
  return true;
}

} // namespace

int bench_memory_main(int argc, char** argv) {
  namespace po = boost::program_options;
  po::options_description opts("dsactor bench memory [--model base] [--batch 32] [--seq 128]");
  opts.add_options()("help,h", "this help")("model", po::value<std::string>()->default_value("base"),
                                             "tiny, mini, small, medium, base or large")(
      "batch", po::value<std::int64_t>()->default_value(32), "micro-batch size")(
      "seq", po::value<std::int64_t>()->default_value(128), "sequence length");
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "bench memory")) return *done;
  auto size = bert::parse_model_size(vm["model"].as<std::string>());
  if (!size) {
    fmt::print(stderr, "dsactor bench memory: --model: {}\n", size.err().message);
    return 2;
  }
  const std::int64_t B = vm["batch"].as<std::int64_t>(), T = vm["seq"].as<std::int64_t>();
  bert::bert_config cfg = bert::bert_config_for(*size);
  fmt::print(
      "Activation memory stashed per encoder layer (fp32): bert-{}, micro-batch {}, seq {}\n",
      bert::model_size_name(*size), B, T);
  fmt::print("  {:<22} {:<24} {:<16} {:>12} {:>8}\n", "normalize_invertible", "attn_dropout_checkpoint",
             "gelu_checkpoint", "MiB/layer", "ratio");
  std::size_t base = 0;
  std::string json = fmt::format("{{\"bench\":\"memory\",\"model\":\"{}\",\"batch\":{},\"seq\":{}", bert::model_size_name(*size), B, T);
  for (int mask = 0; mask < 8; ++mask) {
    cfg.memory.normalize_invertible = mask & 1;
    cfg.memory.attn_dropout_checkpoint = mask & 2;
    cfg.memory.gelu_checkpoint = mask & 4;
    std::size_t bytes = bert::layer_stash_bytes(cfg, B, T, bert::run_mode::train);
    if (mask == 0) base = bytes;
    double ratio = static_cast<double>(bytes) / static_cast<double>(base);
    fmt::print("  {:<22} {:<24} {:<16} {:>12.2f} {:>8.3f}\n", mask & 1 ? "on" : "-",
               mask & 2 ? "on" : "-", mask & 4 ? "on" : "-", mib(bytes), ratio);
    json += fmt::format(",\"bytes_flags_{}\":{}", mask, bytes);
  }
  // Activation checkpointing keeps a layer's f32 input only (part_stash's checkpoints, equal
  // to this in tests/models/test_bert_memory.cpp); the layer being recomputed holds its full
  // stash once per backward.
  const auto checkpointed = static_cast<std::size_t>(B * T * cfg.hidden_size) * sizeof(float);
  fmt::print("  activation checkpointing (model.checkpoint_activations): {:.2f} MiB/layer, ratio {:.3f} (its f32 "
             "input; the layer being recomputed holds its stash once)\n",
             mib(checkpointed), static_cast<double>(checkpointed) / static_cast<double>(base));
  json += fmt::format(",\"bytes_checkpointed\":{}", checkpointed);
  cfg.memory = {};
  if (!print_precisions(cfg, B, T, json))
    return 1;
  fmt::print("{},\"bytes_no_flags\":{}}}\n", json, base);
  return 0;
}

} // namespace dsa::tools
