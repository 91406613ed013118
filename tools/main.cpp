// dsactor: one program, one subcommand per file under tools/.
#include "tools/command.hpp"
#include "tools/program_start.hpp"

#include <fmt/format.h>

#include <cstring>
#include <exception>

namespace {

struct entry {
  const char* name;
  const char* summary;
  dsa::tools::command_fn run;
};

// The list of subcommands: add one line per subcommand.
const entry commands[] = {
    {"run", "train or fine-tune BERT from a config (run CONFIG [--set k=v] [--resume])", dsa::tools::cmd_run},
    {"launch", "start N local processes of one job (launch --num_procs N CONFIG | -- PROGRAM)", dsa::tools::cmd_launch},
    {"convert", "checkpoint conversions: a run's model as one fp32 HuggingFace file (convert zero-to-fp32 CKPT OUT)",
     dsa::tools::cmd_convert},
    {"trace", "inspect a run's actor trace (trace RUN_DIR_OR_FILE summary)", dsa::tools::cmd_trace},
    {"report", "what this machine supports (CPU, BLAS, CUDA, NCCL, UCX, libaio, O_DIRECT)", dsa::tools::cmd_report},
    {"bench", "benchmarks against a peer measured in the same run (kernels, ...)", dsa::tools::cmd_bench},
    {"eval", "score predictions: SQuAD v1.1 exact match and F1 (eval squad)", dsa::tools::cmd_eval},
    {"vocab", "learn a WordPiece vocabulary from a corpus (vocab build)", dsa::tools::cmd_vocab},
    {"nvme-tune", "sweep the [aio] settings on a directory and print the best section (nvme-tune DIR)", dsa::tools::cmd_nvme_tune},
    {"prep", "data preparation: pre-training shards, QA from a corpus", dsa::tools::cmd_prep},
};

void usage() {
  fmt::print("usage: dsactor COMMAND [ARGS...]\n\ncommands:\n");
  for (const auto& c : commands) fmt::print("  {:<10} {}\n", c.name, c.summary);
  fmt::print("\n'dsactor COMMAND --help' describes one command.\n");
}

} // namespace

int main(int argc, char** argv) {
  dsa::tools::start_program(argv);
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  for (const auto& c : commands) {
    if (!std::strcmp(argv[1], c.name)) {
      try {
        return c.run(argc - 1, argv + 1);
      } catch (const std::exception& e) {
        fmt::print(stderr, "dsactor {}: {}\n", c.name, e.what());
        return 1;
      }
    }
  }
  fmt::print(stderr, "dsactor: unknown command '{}'\n\n", argv[1]);
  usage();
  return 2;
}
