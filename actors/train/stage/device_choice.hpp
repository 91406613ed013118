// Where a rank's stages compute: `[devices] backend` and `device` checked against what
// this build holds and what the machine has, at start-up, before anything is allocated.
// A refusal names the reason (a build without CUDA code, no driver, no device, an index
// out of range, a compute capability the kernels were not built for) and is a
// configuration error (dsactor run exits 2).
#pragma once

#include "actors/train/config/run_config.hpp"
#include "actors/train/stage/model_stage.hpp"
#include "core/error.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::train {

// What the process can use: whether the build holds the CUDA code, and the devices
// visible to it (CUDA_VISIBLE_DEVICES applied by the runtime).
struct gpu_facts {
  bool built = false;
  std::string probe; // cuda::probe_devices' message: the devices, or why there are none
  struct device {
    std::string name;
    int major = 0, minor = 0; // compute capability
    std::int64_t bytes = 0;
  };
  std::vector<device> devices;
};

// This process's facts (probes the CUDA runtime in a CUDA build; never aborts).
gpu_facts probe_gpu();

// The compute capability the CUDA kernels are built for (sm_90 code and compute_90 PTX:
// Hopper and later).
constexpr int cuda_min_major = 9;

struct device_choice {
  stage_device device = stage_device::cpu;
  int index = -1;          // the CUDA device (-1 on the CPU)
  std::string description; // for the log: "cpu" or "cuda:0 (NVIDIA H200, sm_90, 139.8 GiB)"
  // The device's bytes, and those free once the run has chosen it (device_free_bytes: the
  // default device budget); 0 on the CPU.
  std::int64_t total_bytes = 0, free_bytes = 0;
};

// What a CUDA rank does not run yet, refused by config key: the GPU-resident optimizer
// (offload_optimizer.device = "none") with LAMB, the compressed optimizers, ZeRO
// partitions or ZeRO-3.
status cuda_rank_supports(const run_config& rc);
// What the GPU-resident optimizer's mode (device_shard) runs: Adam and AdamW over whole
// stages (no ZeRO partitions); `who` names the key that asked for it in the error.
status device_optimizer_supports(const run_config& rc, const std::string& who);

// The device's memory as the run leaves it: the default pool's peak and current bytes in
// use and reserved (every device array of the stages and the GPU optimizer comes from it),
// and the driver's free bytes. Empty for the CPU or a build without CUDA code.
std::string device_memory_report(const device_choice& device);
// cudaMemGetInfo's free bytes on device `index` and what the device's pool keeps free of
// an earlier run in this process (this process's context made there: only the chosen
// device is asked, so no other device gets one); 0 when it cannot be read.
std::int64_t device_free_bytes(int index);
// Resets the default pool's high-water mark to the bytes in use now (a run's start: the
// mark then measures this run, not an earlier one in the process).
void reset_device_pool_peak(const device_choice& device);
// The default pool's high-water mark of bytes in use on the device; -1 for the CPU, a build
// without CUDA code or a failed read.
std::int64_t device_pool_peak(const device_choice& device);

// The device for rc's backend and device on a rank with local index `local_rank` (0
// outside dsactor launch), or a config error saying why it cannot be used (what
// cuda_rank_supports refuses first, then the machine).
expected<device_choice> choose_device(const run_config& rc, int local_rank, const gpu_facts& facts);

} // namespace dsa::train
