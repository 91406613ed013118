// dsactor bench: benchmarks land with their kernels.
#include "tools/command.hpp"

#include <fmt/format.h>

namespace dsa::tools {
int cmd_bench(int, char**) {
  fmt::print(stderr, "dsactor bench: no benchmarks are built yet\n");
  return 2;
}
} // namespace dsa::tools
