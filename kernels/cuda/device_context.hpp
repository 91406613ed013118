// One rank's CUDA device: a compute and a copy stream, ordering between them by events
// (no host waits), and completion notices that only post. The actors' rule holds on
// the GPU: no actor blocks in a synchronize call; a job's completion comes back as a
// message posted from `when_done`'s callback (on a CUDA-owned thread).
#pragma once

#include "core/error.hpp"
#include "kernels/cuda/cuda_allocator.hpp"

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <mutex>

namespace dsa::cuda {

// An owning CUDA handle (stream or event), destroyed with its owner; the status of the
// destroy is ignored (at teardown there is nobody left to tell).
template <class Handle, cudaError_t (*Destroy)(Handle)> class owned_handle {
public:
  explicit owned_handle(Handle h = nullptr) : h_(h) {}
  ~owned_handle() {
    if (h_)
      Destroy(h_);
  }
  owned_handle(owned_handle&& o) noexcept : h_(o.h_) { o.h_ = nullptr; }
  owned_handle& operator=(owned_handle&&) = delete;
  owned_handle(const owned_handle&) = delete;
  Handle get() const { return h_; }

private:
  Handle h_;
};
using stream_handle = owned_handle<cudaStream_t, cudaStreamDestroy>;
using event_handle = owned_handle<cudaEvent_t, cudaEventDestroy>;

class device_context {
public:
  // The context of cuda:index: errc::unsupported when there is no such device (the
  // message says why, from probe_devices), errc::runtime when CUDA fails to set it up.
  static expected<std::unique_ptr<device_context>> open(int index);

  int index() const { return index_; }
  cudaStream_t compute() const { return compute_.get(); }
  cudaStream_t copy() const { return copy_.get(); }
  caching_allocator& allocator() const { return install_caching_allocator(); }

  // Work queued on `waiter` after this call starts only after the work queued on
  // `producer` before it has finished. Device-side ordering; the host does not wait.
  status order(cudaStream_t producer, cudaStream_t waiter);

  // Calls `post` once the work queued on `stream` so far has completed. `post` runs on
  // a CUDA-owned thread and must only post (a message to an actor, a flag): it may not
  // call CUDA or block. A failed kernel before it shows in the stream's next status.
  status when_done(cudaStream_t stream, std::function<void()> post);

private:
  device_context(int index, stream_handle compute, stream_handle copy, event_handle ordering)
      : index_(index), compute_(std::move(compute)), copy_(std::move(copy)),
        ordering_(std::move(ordering)) {}
  int index_;
  stream_handle compute_, copy_;
  std::mutex ordering_mutex_; // order() may be called from several threads
  event_handle ordering_;     // reused by order(): recorded then waited on
};

} // namespace dsa::cuda
