// dsactor-bench: the benchmarks (`dsactor bench WHAT`) and `dsactor nvme-tune`, which
// dsactor runs as `dsactor-bench bench WHAT ...` / `dsactor-bench nvme-tune ...`
// (tools/cmd_bench_forward.cpp). A program of its own so that the training program builds
// without them.
#include "tools/command.hpp"
#include "tools/program_start.hpp"

#include <fmt/format.h>

#include <cstring>
#include <exception>

int main(int argc, char** argv) {
  dsa::tools::start_program(argv);
  if (argc < 2 || (std::strcmp(argv[1], "bench") != 0 && std::strcmp(argv[1], "nvme-tune") != 0)) {
    fmt::print(stderr, "usage: dsactor-bench bench WHAT [options] | dsactor-bench nvme-tune DIR (run through "
                       "`dsactor bench` and `dsactor nvme-tune`)\n");
    return 2;
  }
  const bool bench = !std::strcmp(argv[1], "bench");
  try {
    return bench ? dsa::tools::bench_command(argc - 1, argv + 1) : dsa::tools::nvme_tune_command(argc - 1, argv + 1);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dsactor {}: {}\n", argv[1], e.what());
    return 1;
  }
}
