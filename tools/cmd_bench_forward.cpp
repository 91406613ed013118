// `dsactor bench` and `dsactor nvme-tune`: the benchmarks are a program of their own,
// dsactor-bench, built beside dsactor (so `./ds run` need not compile them); these
// subcommands run it with the same arguments.
#include "tools/command.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

namespace dsa::tools {
namespace {

// dsactor-bench beside this program, or empty when /proc/self/exe cannot be read.
std::string bench_program() {
  std::vector<char> buf(PATH_MAX + 1, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), PATH_MAX);
  if (n <= 0) return {};
  std::string self(buf.data(), static_cast<std::size_t>(n));
  return self.substr(0, self.rfind('/') + 1) + "dsactor-bench";
}

// argv[0] is the subcommand ("bench" or "nvme-tune"); execs `dsactor-bench argv...`.
int run_bench_program(int argc, char** argv) {
  const std::string program = bench_program();
  if (program.empty() || ::access(program.c_str(), X_OK) != 0) {
    fmt::print(stderr,
               "dsactor {}: the benchmarks are a program of their own, {}, which this build does not have ({}); "
               "build it with `ninja -C BUILD_DIR tools/dsactor-bench` (`./ds build` builds everything)\n",
               argv[0], program.empty() ? "dsactor-bench" : program,
               program.empty() ? "/proc/self/exe is unreadable" : std::strerror(errno));
    return 2;
  }
  std::vector<char*> args{const_cast<char*>(program.c_str())};
  for (int i = 0; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(program.c_str(), args.data()); // returns only on failure
  fmt::print(stderr, "dsactor {}: cannot run {}: {}\n", argv[0], program, std::strerror(errno));
  return 1;
}

} // namespace

int cmd_bench(int argc, char** argv) { return run_bench_program(argc, argv); }
int cmd_nvme_tune(int argc, char** argv) { return run_bench_program(argc, argv); }

} // namespace dsa::tools
