// Where a rank's stages compute; see device_choice.hpp.
#include "actors/train/stage/device_choice.hpp"

#if DSA_HAVE_CUDA
#include "kernels/cuda/cuda_allocator.hpp"

#include <cuda_runtime_api.h>
#endif

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

namespace dsa::train {

gpu_facts probe_gpu() {
  gpu_facts f;
#if DSA_HAVE_CUDA
  f.built = true;
  const cuda::device_probe probe = cuda::probe_devices();
  f.probe = probe.message;
  for (int i = 0; i < probe.count; ++i) {
    cudaDeviceProp prop{};
    gpu_facts::device d;
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
      d.name = prop.name;
      d.major = prop.major;
      d.minor = prop.minor;
      d.bytes = static_cast<std::int64_t>(prop.totalGlobalMem);
    } else {
      cudaGetLastError(); // a failed query leaves the error as "last error"
      d.name = "unknown (cudaGetDeviceProperties failed)";
    }
    f.devices.push_back(std::move(d));
  }
#else
  f.probe = "this build has no CUDA code";
#endif
  return f;
}

std::string device_memory_report(const device_choice& device) {
  if (device.device != stage_device::cuda) return {};
#if DSA_HAVE_CUDA
  cudaMemPool_t pool = nullptr;
  std::uint64_t used = 0, used_peak = 0, reserved_peak = 0;
  std::size_t free = 0, total = 0;
  if (cudaSetDevice(device.index) != cudaSuccess || cudaDeviceGetDefaultMemPool(&pool, device.index) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &used_peak) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &reserved_peak) != cudaSuccess ||
      cudaMemGetInfo(&free, &total) != cudaSuccess) {
    const cudaError_t e = cudaGetLastError();
    return fmt::format("{}: could not be read ({})", device.description, cudaGetErrorString(e));
  }
  constexpr double mib = 1024.0 * 1024.0;
  const std::int64_t bound = cuda::binding_pool_peak(device.index);
  const std::string zero3 =
      bound > 0 ? fmt::format(", ZeRO-3's bound weights and gradients peak {:.1f} MiB (a pool of their own)",
                              static_cast<double>(bound) / mib)
                : std::string();
  return fmt::format("{}: peak in use {:.1f} MiB (the pool's high-water mark){}, peak reserved {:.1f} MiB, in use now "
                     "{:.1f} MiB; {:.1f} of {:.1f} MiB free",
                     device.description, static_cast<double>(used_peak) / mib, zero3,
                     static_cast<double>(reserved_peak) / mib, static_cast<double>(used) / mib,
                     static_cast<double>(free) / mib, static_cast<double>(total) / mib);
#else
  return {};
#endif
}

std::int64_t device_free_bytes(int index) {
#if DSA_HAVE_CUDA
  std::size_t free = 0, total = 0;
  cudaMemPool_t pool = nullptr;
  std::uint64_t reserved = 0, used = 0;
  if (cudaSetDevice(index) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess ||
      cudaDeviceGetDefaultMemPool(&pool, index) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  // What the pool keeps of an earlier run in this process (freed, not given back) is free
  // to this one too.
  return static_cast<std::int64_t>(free) + static_cast<std::int64_t>(reserved - std::min(reserved, used));
#else
  (void)index;
  return 0;
#endif
}

void reset_device_pool_peak(const device_choice& device) {
  if (device.device != stage_device::cuda) return;
#if DSA_HAVE_CUDA
  cudaMemPool_t pool = nullptr;
  std::uint64_t zero = 0; // resets the mark to the bytes in use now
  if (cudaSetDevice(device.index) != cudaSuccess || cudaDeviceGetDefaultMemPool(&pool, device.index) != cudaSuccess ||
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero) != cudaSuccess)
    cudaGetLastError();
  cuda::reset_binding_pool_peak(device.index);
#endif
}

std::int64_t device_pool_peak(const device_choice& device) {
  if (device.device != stage_device::cuda) return -1;
#if DSA_HAVE_CUDA
  cudaMemPool_t pool = nullptr;
  std::uint64_t used_peak = 0;
  if (cudaSetDevice(device.index) != cudaSuccess || cudaDeviceGetDefaultMemPool(&pool, device.index) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &used_peak) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  // ZeRO-3's bound weights and gradients come from a pool of their own: its mark on top (an
  // upper bound of the two pools' joint peak).
  return static_cast<std::int64_t>(used_peak) + cuda::binding_pool_peak(device.index);
#else
  return -1;
#endif
}

namespace {
std::string visible_devices() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v ? fmt::format(" (CUDA_VISIBLE_DEVICES={})", v) : std::string();
}
} // namespace

status device_optimizer_supports(const run_config& rc, const std::string& who) {
  const auto type = rc.optimizer.type;
  if (type != optim::optimizer_type::adam && type != optim::optimizer_type::adamw)
    return make_error(errc::config,
                      "{}: the GPU-resident optimizer (offload_optimizer.device = \"none\") runs Adam and AdamW, not "
                      "optimizer.type = \"{}\"; set zero_optimization.offload_optimizer.device = \"cpu\" (stage >= 1) to "
                      "step it on the CPU shard",
                      who, optim::optimizer_name(type));
  if (rc.zero_partitions())
    return make_error(errc::config,
                      "{} with zero_optimization.stage = {} over {} ranks: ZeRO partitions of the GPU-resident "
                      "optimizer (offload_optimizer.device = \"none\") are not written yet; use stage 0, or "
                      "offload_optimizer.device = \"cpu\" to partition it in host memory",
                      who, rc.zero_stage, rc.batch.data_parallel_size);
  return {};
}

// What a CUDA rank does not run yet, named by its config key (checked before the machine).
status cuda_rank_supports(const run_config& rc) {
  // offload_optimizer.device = "none": the masters and moments on the GPU (device_shard).
  if (rc.offload.device == offload_device::none) DSA_TRY(device_optimizer_supports(rc, "devices.backend = \"cuda\""));
  if (rc.schedule == "zb")
    return make_error(errc::config, "devices.backend = \"cuda\" with pipeline.schedule = \"zb\": the GPU stage does "
                                    "not split its backward into B and W yet; use \"1f1b\"");
  if (rc.cpu_checkpointing)
    return make_error(errc::config, "devices.backend = \"cuda\" with activation_checkpointing.cpu_checkpointing = true: "
                                    "DeepSpeed moves the checkpoints to host memory; a CUDA rank keeps them on the "
                                    "device (moving them is not written): set false");
  // ZeRO-2 on one pipeline stage runs (cuda_stage's partitioned gradients, summed on the host);
  // ZeRO-3 gathers each part's weights onto the device as it runs it (cuda_zero3.hpp), the
  // partition's optimizer on the host.
  if (rc.zero_stage >= 3 && rc.offload.device == offload_device::none)
    return make_error(errc::config,
                      "devices.backend = \"cuda\" with zero_optimization.stage = {} and "
                      "offload_optimizer.device = \"none\": a CUDA rank's ZeRO-3 partitions step on the CPU; set "
                      "zero_optimization.offload_optimizer.device = \"cpu\" or \"nvme\"",
                      rc.zero_stage);
  return {};
}

expected<device_choice> choose_device(const run_config& rc, int local_rank, const gpu_facts& facts) {
  device_choice c;
  if (rc.backend == "cpu") {
    c.description = "cpu";
    return c;
  }
  DSA_TRY(cuda_rank_supports(rc));
  if (!facts.built)
    return make_error(errc::config,
                      "devices.backend = \"cuda\": this build has no CUDA code (nvcc was not found when it was "
                      "configured, or it was configured with -Dcuda=disabled; `./ds run` builds it only where a GPU "
                      "is visible or with DSA_CUDA=1)");
  if (facts.devices.empty())
    return make_error(errc::config, "devices.backend = \"cuda\": {}{}", facts.probe, visible_devices());
  const std::int64_t index = rc.device >= 0 ? rc.device : local_rank;
  if (index >= static_cast<std::int64_t>(facts.devices.size()))
    return make_error(errc::config, "devices.device = {}{}: only {} CUDA device(s) visible{}: {}", index,
                      rc.device < 0 ? fmt::format(" (the local rank {})", local_rank) : std::string(),
                      facts.devices.size(), visible_devices(), facts.probe);
  const gpu_facts::device& d = facts.devices[static_cast<std::size_t>(index)];
  c.index = static_cast<int>(index);
  c.total_bytes = d.bytes;
  c.description = fmt::format("cuda:{} ({}, sm_{}{}, {:.1f} GiB)", index, d.name, d.major, d.minor,
                              static_cast<double>(d.bytes) / (1024.0 * 1024.0 * 1024.0));
  if (d.major < cuda_min_major)
    return make_error(errc::config,
                      "devices.backend = \"cuda\": {} has compute capability {}.{}; this build's kernels need {}.0 or "
                      "newer (sm_90 code: H100, H200 and later)",
                      c.description, d.major, d.minor, cuda_min_major);
  c.device = stage_device::cuda;
  return c;
}

} // namespace dsa::train
