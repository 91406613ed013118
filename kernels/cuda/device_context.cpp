// CUDA device context: streams, event ordering and posting completions (see header).
#include "kernels/cuda/device_context.hpp"

#include <cuda_runtime.h>

namespace dsa::cuda {
namespace {

error cuda_error(const char* what, int index, cudaError_t status) {
  return make_error(errc::runtime, "cuda:{}: {} failed: {} ({})", index, what,
                    cudaGetErrorString(status), cudaGetErrorName(status));
}

// The heap-held callback of one when_done: deleted by the trampoline after it runs.
void CUDART_CB run_posted(void* data) {
  std::unique_ptr<std::function<void()>> post(static_cast<std::function<void()>*>(data));
  (*post)();
}

} // namespace

expected<std::unique_ptr<device_context>> device_context::open(int index) {
  const device_probe probe = probe_devices();
  if (index < 0 || index >= probe.count)
    return make_error(errc::unsupported, "cuda:{} is not available: {}", index, probe.message);
  cudaError_t status = cudaSetDevice(index);
  if (status != cudaSuccess)
    return cuda_error("cudaSetDevice", index, status);
  cudaStream_t compute = nullptr, copy = nullptr;
  cudaEvent_t ordering = nullptr;
  // Non-blocking: the legacy default stream (used by nobody here) must not serialize them.
  if ((status = cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking)) != cudaSuccess)
    return cuda_error("cudaStreamCreateWithFlags (compute)", index, status);
  stream_handle compute_handle(compute);
  if ((status = cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking)) != cudaSuccess)
    return cuda_error("cudaStreamCreateWithFlags (copy)", index, status);
  stream_handle copy_handle(copy);
  if ((status = cudaEventCreateWithFlags(&ordering, cudaEventDisableTiming)) != cudaSuccess)
    return cuda_error("cudaEventCreateWithFlags", index, status);
  return std::unique_ptr<device_context>(new device_context(
      index, std::move(compute_handle), std::move(copy_handle), event_handle(ordering)));
}

status device_context::order(cudaStream_t producer, cudaStream_t waiter) {
  // cudaStreamWaitEvent captures the event's state at the call, so one event serves
  // every ordering, as long as record and wait are not interleaved between threads.
  std::lock_guard<std::mutex> lock(ordering_mutex_);
  cudaError_t status = cudaEventRecord(ordering_.get(), producer);
  if (status != cudaSuccess)
    return cuda_error("cudaEventRecord", index_, status);
  status = cudaStreamWaitEvent(waiter, ordering_.get(), 0);
  if (status != cudaSuccess)
    return cuda_error("cudaStreamWaitEvent", index_, status);
  return {};
}

status device_context::when_done(cudaStream_t stream, std::function<void()> post) {
  auto held = std::make_unique<std::function<void()>>(std::move(post));
  const cudaError_t status = cudaLaunchHostFunc(stream, run_posted, held.get());
  if (status != cudaSuccess)
    return cuda_error("cudaLaunchHostFunc", index_, status);
  held.release(); // now owned by run_posted
  return {};
}

} // namespace dsa::cuda
