// dsactor bench gpu-kernels and gpu-train (CUDA builds only): see bench_gpu.cpp and
// bench_gpu_train.cpp.
#pragma once

#include <cuda_runtime_api.h>

namespace dsa::tools {

// Exit status: 0 valid, 1 a kernel disagreed with its CPU twin, 3 no CUDA device.
int bench_gpu_main(int argc, char** argv);
// Exit status: 0 done, 2 bad options, 3 no CUDA device.
int bench_gpu_train_main(int argc, char** argv);

// cuBLASLt bf16 8192^3 products on random data: the median TFLOP/s (the peak the GPU
// benchmarks measure against).
double bf16_gemm_peak_tflops(cudaStream_t stream);

} // namespace dsa::tools
