// `dsactor bench offload DIR`: one BERT trained twice in the same process by
// dsactor run's trainer, with the optimizer state in memory and swapped to NVMe
// in DIR (ZeRO-Infinity), and which resource bounds the offloaded step.
#pragma once

namespace dsa::tools {

int bench_offload_main(int argc, char** argv);

} // namespace dsa::tools
