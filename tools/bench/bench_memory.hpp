// `dsactor bench memory`: stashed activation bytes per layer for each memory-flag
// setting, and working-weight and activation bytes per precision.
#pragma once

namespace dsa::tools {
int bench_memory_main(int argc, char** argv);
} // namespace dsa::tools
