// dsactor bench gpu-kernels, gpu-train and train (CUDA builds only): see bench_gpu.cpp,
// bench_gpu_train.cpp and bench_train.cpp.
#pragma once

#include "models/bert/bert_config.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::tools {

// Exit status: 0 valid, 1 a kernel disagreed with its CPU twin, 3 no CUDA device.
int bench_gpu_main(int argc, char** argv);
// Exit status: 0 done, 2 bad options, 3 no CUDA device.
int bench_gpu_train_main(int argc, char** argv);

// Exit status: 0 done (the ratio printed), 1 a run failed, 2 bad options, 3 no CUDA device.
int bench_train_main(int argc, char** argv);
// dsactor bench offload DIR --backend cuda (bench_offload_cuda.cpp): the optimizer on the GPU, on the
// CPU shard and on NVMe in DIR, one call.
int bench_offload_cuda_main(int argc, char** argv);
// Exit status: 0 done (the table printed), 2 bad options, 3 no CUDA device.
int bench_gpu_memory_main(int argc, char** argv);

// The bare GPU model's step (models/bert/cuda_model.hpp: forward, backward and the fused
// AdamW over the whole model, bf16, one synthetic micro-batch), after 2 warm-up steps.
struct bare_step {
  double seconds = 0; // per step
  double loss = 0;    // the last step's
  std::int64_t parameters = 0;
};
bare_step bare_gpu_train(const bert::bert_config& cfg, std::int64_t seq, std::int64_t batch, std::int64_t steps,
                         cudaStream_t stream);
// Model FLOPs per sample of a pre-training step, as tools/bench/bench_torch_bert.py counts.
double flops_per_sample(const bert::bert_config& cfg, std::int64_t seq);

// cuBLASLt bf16 8192^3 products on random data: the median TFLOP/s (the peak the GPU
// benchmarks measure against).
double bf16_gemm_peak_tflops(cudaStream_t stream);

} // namespace dsa::tools
