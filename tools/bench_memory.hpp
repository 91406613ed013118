// `dsactor bench memory`: stashed activation bytes per layer for each memory-flag setting.
#pragma once

namespace dsa::tools {
int bench_memory_main(int argc, char** argv);
} // namespace dsa::tools
