// ZeRO-3 on a CUDA stage: the zero3_binder over a GPU part made without resident
// parameters (CUDA builds only). The weights the parameter fetcher gathered on the host go
// onto the device as the part starts (bind_value, on the part's stream) and are freed in
// stream order as it ends, so the GPU holds the part in use (and the persistent tensors)
// while the rest stays in the fetcher's partition, in host memory or on NVMe
// (offload_param); the gathered tensors are copied into one of `window` pinned upload
// buffers (a part's at a time, reused once the bind stream has read it) and from there onto
// the device without holding the host; the copies run on a stream of the part's own, so a
// part's weights come in while the previous parts compute, at most `window` parts' weights
// on the device at once (bind_window: the copies of the part entered k-th wait for the
// end of the one entered window parts before it; window 1: no overlap). A part's final gradients are
// copied to one pinned staging buffer on a copy stream behind its kernels and freed there;
// the host takes them out (waiting for that copy only) when the next part's are handed
// over or the backward ends, while the GPU runs on, and gives them to the gradient
// partition.
#pragma once

#include "actors/train/stage/partition_grads.hpp"
#include "actors/train/stage/zero3_binding.hpp"
#include "models/bert/cuda_part.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace dsa::train {

class cuda_zero3_binder final : public zero3_binder {
public:
  // window: parts whose weights may be bound at once (the device plan's choice, >= 1);
  // upload_bytes: each upload buffer's size, reserved here (zero3_upload_bytes).
  cuda_zero3_binder(bert::gpu::part& part, partition_grads& grads, std::size_t window, std::size_t upload_bytes);
  ~cuda_zero3_binder() override; // on the part's device: waits for a copy in flight
  cuda_zero3_binder(const cuda_zero3_binder&) = delete;
  cuda_zero3_binder& operator=(const cuda_zero3_binder&) = delete;

  void bind_values(std::vector<std::pair<std::size_t, tensor>> values) override;
  void unbind_values(const std::vector<std::size_t>& indices) override;
  void bind_gradients(const std::vector<std::size_t>& indices) override;
  void hand_over(const std::vector<std::size_t>& indices, std::uint32_t step) override;
  // The backward is enqueued: the last part's gradients to the partition (waits for their copy).
  void finish();

private:
  void take_pending();
  bert::gpu::part& part_;
  partition_grads& grads_;
  bert::gpu::pinned_buffer staging_;
  std::size_t staged_bytes_ = 0;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t after_compute_ = nullptr, copied_ = nullptr;
  bind_window window_;
  std::vector<cudaEvent_t> part_ends_; // bind_window's slots: a part's end on the part's stream
  struct upload_slot {
    bert::gpu::pinned_buffer buffer;
    cudaEvent_t read = nullptr; // on the bind stream after the copies out of it
    bool used = false;
  };
  std::vector<upload_slot> uploads_; // a part's gathered weights each, in turn
  std::size_t next_upload_ = 0;
  struct pending {
    std::vector<std::size_t> indices, offsets; // offsets in staging_, bytes
    std::uint32_t step = 0;
  };
  std::vector<pending> pending_; // at most one: the last part handed over
};

} // namespace dsa::train
