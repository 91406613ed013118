// dsactor bench memory: activation bytes one encoder layer stashes for backward
// under each combination of DeepSpeed's transformer memory flags
// (normalize_invertible, attn_dropout_checkpoint, gelu_checkpoint), against the
// no-flag baseline. The byte counts are what the forward really stashes
// (models/bert tests check the formula against a real forward).
#include "tools/bench_memory.hpp"

#include "models/bert/encoder_layer.hpp"

#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <string>

namespace dsa::tools {

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
  fmt::print("Activation memory stashed per encoder layer: bert-{}, micro-batch {}, seq {}\n",
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
    fmt::print("  {:<22} {:<24} {:<16} {:>12.2f} {:>8.3f}\n", mask & 1 ? "on" : "-", mask & 2 ? "on" : "-",
               mask & 4 ? "on" : "-", static_cast<double>(bytes) / (1 << 20), ratio);
    json += fmt::format(",\"bytes_flags_{}\":{}", mask, bytes);
  }
  fmt::print("{},\"bytes_no_flags\":{}}}\n", json, base);
  return 0;
}

} // namespace dsa::tools
