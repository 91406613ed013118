// dsactor bench gpu-kernels (CUDA builds only): see bench_gpu.cpp.
#pragma once

namespace dsa::tools {

// Exit status: 0 valid, 1 a kernel disagreed with its CPU twin, 3 no CUDA device.
int bench_gpu_main(int argc, char** argv);

} // namespace dsa::tools
