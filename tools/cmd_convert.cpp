// dsactor convert: checkpoint conversions. "zero-to-fp32" writes a run's model as one
// HuggingFace-named fp32 safetensors file, as DeepSpeed's zero_to_fp32.py does.
#include "actors/train/run/run_checkpoint.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

namespace dsa::tools {
namespace {

namespace po = boost::program_options;

int zero_to_fp32(int argc, char** argv) {
  po::options_description opts("dsactor convert zero-to-fp32 CHECKPOINT OUT.safetensors");
  opts.add_options()("help,h", "this help")("checkpoint", po::value<std::string>()->required(),
                                            "a checkpoint directory (step_N), a checkpoint root (its latest), or a "
                                            "safetensors file: any form init_checkpoint accepts")(
      "out", po::value<std::string>()->required(), "the fp32 safetensors file to write (atomically)");
  po::positional_options_description positional;
  positional.add("checkpoint", 1).add("out", 1);
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "convert zero-to-fp32",
                                "Every rank's partition is gathered into a checkpoint's model when it is saved, so\n"
                                "the file written holds the whole model under HuggingFace names.\n",
                                &positional))
    return *done;
  const std::string out = vm["out"].as<std::string>();
  auto c = train::convert_to_fp32(vm["checkpoint"].as<std::string>(), out);
  if (!c) {
    fmt::print(stderr, "dsactor convert zero-to-fp32: {}\n", c.err().message);
    return c.err().code == errc::not_found ? 2 : 1;
  }
  fmt::print("wrote {}: {} tensors, {} parameters in fp32, from {}{}\n", out, c->tensors, c->parameters, c->source,
             c->skipped.empty() ? std::string()
                                : fmt::format(" ({} integer tensor(s) left out: {})", c->skipped.size(),
                                              fmt::join(c->skipped, ", ")));
  return 0;
}

} // namespace

int cmd_convert(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    fmt::print("usage: dsactor convert WHAT [options]\n"
               "  zero-to-fp32   a checkpoint's model as one fp32 HuggingFace-named safetensors file\n");
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "zero-to-fp32")) return zero_to_fp32(argc - 1, argv + 1);
  fmt::print(stderr, "dsactor convert: unknown conversion '{}' (known: zero-to-fp32)\n", argv[1]);
  return 2;
}

} // namespace dsa::tools
