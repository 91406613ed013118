// The CUDA caching allocator registered for device_kind::cuda: stream-ordered
// allocations (cudaMallocFromPoolAsync) from each device's default memory pool with its
// release threshold raised, so freed blocks stay cached and a steady-state step makes
// no cudaMalloc. Tensor bytes are accounted by core (memory_usage_of); the pool's own
// reserved and used bytes are reported here.
#pragma once

#include "core/device.hpp"
#include "core/memory_stats.hpp"
#include "core/tensor.hpp"

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <string>

namespace dsa::cuda {

// Devices this process can use: count 0 with the runtime's reason when there is no
// driver, no device, or the runtime fails to start. Never aborts.
struct device_probe {
  int count = 0;
  std::string message; // "2 CUDA devices: NVIDIA H100 ..." or why there are none
};
device_probe probe_devices();

// Aborts with the CUDA error string, file and line when `expr` fails (used where the
// calling interface, such as allocator, has no error return).
#define DSA_CUDA_CHECK(expr)                                                                       \
  do {                                                                                             \
    const cudaError_t dsa_cuda_status_ = (expr);                                                   \
    DSA_CHECK(dsa_cuda_status_ == cudaSuccess, "{} failed: {}", #expr,                             \
              cudaGetErrorString(dsa_cuda_status_));                                               \
  } while (0)

// Pool figures of one device (cudaMemPoolAttr*): bytes reserved from the driver and
// bytes handed out, current and high-water.
struct pool_usage {
  std::int64_t reserved_bytes = 0;
  std::int64_t reserved_peak_bytes = 0;
  std::int64_t used_bytes = 0;
  std::int64_t used_peak_bytes = 0;
};

class caching_allocator final : public allocator {
public:
  caching_allocator() = default;
  ~caching_allocator() override;
  caching_allocator(const caching_allocator&) = delete;
  caching_allocator& operator=(const caching_allocator&) = delete;

  // allocator: memory on dev, usable by any stream on return (the allocation is ordered
  // on this allocator's stream, which is synchronized: it holds nothing but
  // allocations, so this waits for no kernel). The caller frees only after the work
  // using the memory has completed (actors free on the completion message).
  void* allocate(std::size_t bytes, device dev) override;
  void deallocate(void* ptr, std::size_t bytes, device dev) override;

  // Stream-ordered forms for code that owns a stream: the memory may be used by work
  // queued on `stream` after this call, and freed after the last such work is queued.
  void* allocate_async(std::size_t bytes, device dev, cudaStream_t stream);
  void deallocate_async(void* ptr, device dev, cudaStream_t stream);

  pool_usage usage(device dev);

private:
  struct per_device {
    bool ready = false;
    cudaMemPool_t pool = nullptr;
    cudaStream_t stream = nullptr;
  };
  per_device& state(device dev);

  std::mutex mutex_;
  std::array<per_device, max_tracked_cuda_devices> devices_{};
};

// The process-wide instance; registers it for device_kind::cuda on first call. Touches
// no CUDA API until a cuda tensor is allocated, so it is safe without a GPU.
caching_allocator& install_caching_allocator();

// A second pool per device, for ZeRO-3's bound weights and gradients (models/bert's
// part::bind_value): they are allocated on one stream and freed on another, and the default
// pool would reuse such a block by making the allocating stream wait for the freeing one
// (cudaMemPoolReuseAllowInternalDependencies), which serialises the copies with the compute
// they should overlap. This pool has that off (it takes a block back once its free has
// completed, or grows) and its release threshold raised. Made on first use; null with the
// runtime's error in `why` when it cannot be.
cudaMemPool_t binding_pool(int device, std::string& why);
// Its high-water mark of bytes handed out (0 when it was never made), and a reset of that
// mark to the bytes in use now.
std::int64_t binding_pool_peak(int device);
void reset_binding_pool_peak(int device);

} // namespace dsa::cuda
