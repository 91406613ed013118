// CUDA caching allocator over the devices' default memory pools (see the header).
#include "kernels/cuda/cuda_allocator.hpp"

#include "core/device_waits.hpp"
#include "core/error.hpp"

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>

namespace dsa::cuda {

device_probe probe_devices() {
  device_probe probe;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    probe.message = fmt::format("no usable CUDA device: cudaGetDeviceCount: {} ({})",
                                cudaGetErrorString(status), cudaGetErrorName(status));
    cudaGetLastError(); // a failed probe leaves the error as "last error"; clear it
    return probe;
  }
  if (count == 0) {
    probe.message = "no CUDA device: cudaGetDeviceCount returned 0";
    return probe;
  }
  probe.count = count;
  probe.message = fmt::format("{} CUDA device(s)", count);
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess)
      probe.message +=
          fmt::format("; cuda:{} {} sm_{}{} {:.1f} GiB", i, prop.name, prop.major, prop.minor,
                      static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  }
  return probe;
}

caching_allocator::~caching_allocator() {
  // Process teardown: the driver may already be unloading, so statuses are ignored.
  for (auto& d : devices_)
    if (d.ready)
      cudaStreamDestroy(d.stream);
}

caching_allocator::per_device& caching_allocator::state(device dev) {
  DSA_CHECK(dev.kind == device_kind::cuda && dev.index >= 0 && dev.index < max_tracked_cuda_devices,
            "caching_allocator: bad device {}", dev.to_string());
  std::lock_guard<std::mutex> lock(mutex_);
  per_device& d = devices_[static_cast<std::size_t>(dev.index)];
  if (d.ready)
    return d;
  DSA_CUDA_CHECK(cudaSetDevice(dev.index));
  DSA_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&d.pool, dev.index));
  // Keep freed memory in the pool instead of returning it at each synchronization.
  std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
  DSA_CUDA_CHECK(cudaMemPoolSetAttribute(d.pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  DSA_CUDA_CHECK(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
  d.ready = true;
  return d;
}

void* caching_allocator::allocate_async(std::size_t bytes, device dev, cudaStream_t stream) {
  per_device& d = state(dev);
  void* p = nullptr;
  DSA_CUDA_CHECK(cudaSetDevice(dev.index));
  const cudaError_t status = cudaMallocFromPoolAsync(&p, bytes == 0 ? 1 : bytes, d.pool, stream);
  DSA_CHECK(status == cudaSuccess, "out of memory on {} allocating {} bytes: {}", dev.to_string(),
            bytes, cudaGetErrorString(status));
  return p;
}

void caching_allocator::deallocate_async(void* ptr, device dev, cudaStream_t stream) {
  DSA_CUDA_CHECK(cudaSetDevice(dev.index));
  DSA_CUDA_CHECK(cudaFreeAsync(ptr, stream));
}

void* caching_allocator::allocate(std::size_t bytes, device dev) {
  cudaStream_t stream = state(dev).stream;
  void* p = allocate_async(bytes, dev, stream);
  device_wait("cudaStreamSynchronize (a synchronous device allocation)");
  DSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return p;
}

void caching_allocator::deallocate(void* ptr, std::size_t, device dev) {
  deallocate_async(ptr, dev, state(dev).stream);
}

pool_usage caching_allocator::usage(device dev) {
  per_device& d = state(dev);
  auto get = [&](cudaMemPoolAttr attr) {
    std::uint64_t value = 0;
    DSA_CUDA_CHECK(cudaMemPoolGetAttribute(d.pool, attr, &value));
    return static_cast<std::int64_t>(value);
  };
  pool_usage u;
  u.reserved_bytes = get(cudaMemPoolAttrReservedMemCurrent);
  u.reserved_peak_bytes = get(cudaMemPoolAttrReservedMemHigh);
  u.used_bytes = get(cudaMemPoolAttrUsedMemCurrent);
  u.used_peak_bytes = get(cudaMemPoolAttrUsedMemHigh);
  return u;
}

caching_allocator& install_caching_allocator() {
  static caching_allocator instance;
  static const bool registered = [] {
    register_allocator(device_kind::cuda, &instance);
    return true;
  }();
  (void)registered;
  return instance;
}

namespace {

struct binding_pools {
  std::mutex mu;
  std::array<cudaMemPool_t, 64> pools{};
};

binding_pools& all_binding_pools() {
  static binding_pools p; // never destroyed: a pool outlives the process's last free
  return p;
}

} // namespace

cudaMemPool_t binding_pool(int device, std::string& why) {
  binding_pools& all = all_binding_pools();
  if (device < 0 || device >= static_cast<int>(all.pools.size())) {
    why = "device index out of range";
    return nullptr;
  }
  std::lock_guard<std::mutex> lk(all.mu);
  cudaMemPool_t& pool = all.pools[static_cast<std::size_t>(device)];
  if (pool) return pool;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t made = nullptr;
  std::uint64_t keep = ~std::uint64_t{0};
  int off = 0;
  cudaError_t e = cudaMemPoolCreate(&made, &props);
  if (e == cudaSuccess) e = cudaMemPoolSetAttribute(made, cudaMemPoolAttrReleaseThreshold, &keep);
  if (e == cudaSuccess) e = cudaMemPoolSetAttribute(made, cudaMemPoolReuseAllowInternalDependencies, &off);
  if (e != cudaSuccess) {
    why = cudaGetErrorString(e);
    (void)cudaGetLastError();
    if (made) cudaMemPoolDestroy(made);
    return nullptr;
  }
  pool = made;
  return pool;
}

std::int64_t binding_pool_peak(int device) {
  binding_pools& all = all_binding_pools();
  if (device < 0 || device >= static_cast<int>(all.pools.size())) return 0;
  std::lock_guard<std::mutex> lk(all.mu);
  cudaMemPool_t pool = all.pools[static_cast<std::size_t>(device)];
  std::uint64_t peak = 0;
  if (!pool || cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &peak) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return static_cast<std::int64_t>(peak);
}

void reset_binding_pool_peak(int device) {
  binding_pools& all = all_binding_pools();
  if (device < 0 || device >= static_cast<int>(all.pools.size())) return;
  std::lock_guard<std::mutex> lk(all.mu);
  cudaMemPool_t pool = all.pools[static_cast<std::size_t>(device)];
  std::uint64_t zero = 0;
  if (pool && cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero) != cudaSuccess) (void)cudaGetLastError();
}

} // namespace dsa::cuda
