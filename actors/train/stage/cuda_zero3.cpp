// ZeRO-3 on a CUDA stage: the bindings on its GPU part (see cuda_zero3.hpp) and the
// stage's hand-over of its weights to the fetcher and back.
#include "actors/train/stage/cuda_zero3.hpp"

#include "actors/train/stage/cuda_stage.hpp"

#include "core/device_waits.hpp"

#include <fmt/format.h>

#include <cstring>
#include <stdexcept>

namespace dsa::train {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(fmt::format("CUDA stage (ZeRO-3): {} failed: {}", what, cudaGetErrorString(e)));
}

} // namespace

cuda_zero3_binder::cuda_zero3_binder(bert::gpu::part& part, partition_grads& grads, std::size_t window,
                                     std::size_t upload_bytes)
    : part_(part), grads_(grads), window_(window) {
  // What was made is destroyed on a failure here (the destructor does not run).
  auto undo = [&] {
    for (cudaEvent_t ev : part_ends_) cudaEventDestroy(ev);
    for (upload_slot& u : uploads_)
      if (u.read) cudaEventDestroy(u.read);
    if (copied_) cudaEventDestroy(copied_);
    if (after_compute_) cudaEventDestroy(after_compute_);
    if (copy_) cudaStreamDestroy(copy_);
  };
  auto fail = [&](cudaError_t e, const char* what) {
    undo();
    check_cuda(e, what);
  };
  cudaError_t e = cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking);
  if (e != cudaSuccess) fail(e, "creating the gradient copy stream");
  e = cudaEventCreateWithFlags(&after_compute_, cudaEventDisableTiming);
  if (e != cudaSuccess) fail(e, "creating a gradient copy event");
  e = cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming);
  if (e != cudaSuccess) fail(e, "creating the gradient staging event");
  for (std::size_t k = 0; k < window; ++k) {
    cudaEvent_t ev = nullptr;
    e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) fail(e, "creating a part's end event");
    part_ends_.push_back(ev);
  }
  uploads_.resize(window);
  for (upload_slot& u : uploads_) {
    e = cudaEventCreateWithFlags(&u.read, cudaEventDisableTiming);
    if (e != cudaSuccess) fail(e, "creating an upload buffer's event");
  }
  // At their size once: growing one later would free pinned memory, which waits for the device.
  try {
    for (upload_slot& u : uploads_) u.buffer.reserve(upload_bytes, "a CUDA stage's ZeRO-3 weight uploads");
  } catch (...) {
    undo();
    throw;
  }
}

cuda_zero3_binder::~cuda_zero3_binder() {
  cudaStreamSynchronize(copy_); // no copy left writing into the staging buffer, no free pending on the stream
  for (const upload_slot& u : uploads_)
    if (u.used) { // no copy left reading an upload buffer (the bind stream exists: it copied)
      cudaEventSynchronize(u.read);
    }
  for (upload_slot& u : uploads_) cudaEventDestroy(u.read);
  for (cudaEvent_t ev : part_ends_) cudaEventDestroy(ev);
  cudaEventDestroy(copied_);
  cudaEventDestroy(after_compute_);
  cudaStreamDestroy(copy_);
}

void cuda_zero3_binder::bind_values(std::vector<std::pair<std::size_t, tensor>> values) {
  // The window: this part's weights come in once the part `window` parts back has freed
  // its own (a part that binds nothing new waits for nothing).
  const std::optional<std::size_t> after = window_.enter();
  if (values.empty()) return;
  if (after) part_.bind_after(part_ends_[*after]);
  // Through an upload buffer: the fetcher's tensors are pageable (a copy from them holds the
  // host until the driver has staged it, and the bind stream may be waiting for the window).
  upload_slot& slot = uploads_[next_upload_];
  next_upload_ = (next_upload_ + 1) % uploads_.size();
  if (slot.used) { // its last part's copies have read it
    device_wait("cudaEventSynchronize (an upload buffer's copies done, before it takes the next part's weights)");
    check_cuda(cudaEventSynchronize(slot.read), "an upload buffer's copies");
  }
  std::size_t bytes = 0;
  for (const auto& [i, value] : values)
    if (value.defined()) bytes += zero3_padded(value.nbytes());
  // Reserved at construction for any use; only a use larger than planned grows it (pageable,
  // and said, when pinning fails).
  slot.buffer.reserve(bytes, "a CUDA stage's ZeRO-3 weight uploads");
  const cudaStream_t copies = part_.bind_stream();
  std::size_t at = 0;
  slot.used = true;
  try {
    for (const auto& [i, value] : values) {
      if (!value.defined() || !value.is_contiguous()) { // refused by bind_value, naming the parameter
        part_.bind_value(i, value);
        continue;
      }
      char* to = static_cast<char*>(slot.buffer.get()) + at;
      std::memcpy(to, value.raw_data(), value.nbytes());
      part_.bind_value(i, tensor::from_storage(storage::wrap(to, value.nbytes(), device::cpu(), [](void*) {}), 0,
                                               value.shape(), value.type()));
      at += zero3_padded(value.nbytes());
    }
  } catch (...) {
    cudaEventRecord(slot.read, copies); // after what was enqueued from it
    throw;
  }
  check_cuda(cudaEventRecord(slot.read, copies), "marking an upload buffer's copies");
}

void cuda_zero3_binder::unbind_values(const std::vector<std::size_t>& indices) {
  for (std::size_t i : indices) part_.unbind_value(i);
  // After the part's kernels and its values' frees on the part's stream.
  check_cuda(cudaEventRecord(part_ends_[window_.leave()], part_.stream()), "marking a part's end");
}

void cuda_zero3_binder::bind_gradients(const std::vector<std::size_t>& indices) {
  for (std::size_t i : indices) part_.bind_gradient(i);
}

void cuda_zero3_binder::hand_over(const std::vector<std::size_t>& indices, std::uint32_t step) {
  take_pending(); // the staging buffer is free again
  pending p;
  p.step = step;
  std::size_t bytes = 0;
  for (std::size_t i : indices) {
    p.indices.push_back(i);
    p.offsets.push_back(bytes);
    bytes += zero3_padded(static_cast<std::size_t>(part_.numel(i)) * 4);
  }
  if (bytes > staged_bytes_) {
    staging_.reserve(bytes, "a CUDA stage's ZeRO-3 gradient staging"); // pageable (and said) when pinning fails
    staged_bytes_ = bytes;
  }
  // On the copy stream behind the part's kernels, so the next part's compute need not wait
  // for the copies.
  check_cuda(cudaEventRecord(after_compute_, part_.stream()), "marking a part's backward");
  check_cuda(cudaStreamWaitEvent(copy_, after_compute_, 0), "ordering the gradient copies after the backward");
  for (std::size_t k = 0; k < p.indices.size(); ++k) {
    const std::size_t i = p.indices[k];
    check_cuda(cudaMemcpyAsync(static_cast<char*>(staging_.get()) + p.offsets[k], part_.gradient_data(i),
                               static_cast<std::size_t>(part_.numel(i)) * 4, cudaMemcpyDeviceToHost, copy_),
               "copying a final gradient to the host");
    part_.unbind_gradient(i, copy_); // freed on the copy stream, after the copy
  }
  check_cuda(cudaEventRecord(copied_, copy_), "marking a part's gradient copies");
  pending_.push_back(std::move(p));
}

void cuda_zero3_binder::finish() { take_pending(); }

void cuda_zero3_binder::take_pending() {
  if (pending_.empty()) return;
  device_wait("cudaEventSynchronize (a part's final gradients copied to the host)");
  check_cuda(cudaEventSynchronize(copied_), "the gradient copies");
  pending p = std::move(pending_.front());
  pending_.clear();
  for (std::size_t k = 0; k < p.indices.size(); ++k) {
    const std::size_t i = p.indices[k];
    // A tensor of its own: the staging buffer takes the next part's gradients.
    tensor own = tensor::empty({part_.numel(i)}, dtype::f32);
    std::memcpy(own.raw_data(), static_cast<const char*>(staging_.get()) + p.offsets[k], own.nbytes());
    grads_.submit(i, std::move(own), p.step);
  }
}

void cuda_stage::enable_zero3(std::shared_ptr<param_fetcher> fetcher, std::shared_ptr<partition_grads> grads) {
  const std::string range = params_.range().to_string();
  if (!fetcher || !grads || fetcher->layout().tensors().size() != params_.entries().size())
    throw std::runtime_error(fmt::format("CUDA stage {}: ZeRO-3 without a fetcher and a gradient partition of its "
                                         "layout",
                                         range));
  if (part_)
    throw std::runtime_error(fmt::format("CUDA stage {}: ZeRO-3 enabled after the device part was made", range));
  fetcher_ = std::move(fetcher);
  grads_ = std::move(grads);
}

void cuda_stage::partition_weights() {
  hand_weights_to(*fetcher_, params_, parameters());
  partitioned_ = true;
}

void cuda_stage::gather_whole() {
  if (!fetcher_) return;
  if (part_) {
    check_cuda(cudaSetDevice(options_.device_index), "cudaSetDevice");
    device_wait("cudaStreamSynchronize (the last step's work before the weights are gathered)");
    check_cuda(cudaStreamSynchronize(stream_->get()), "the stage's stream");
  }
  take_weights_back(*fetcher_, params_);
  // The device part goes; the next use makes a resident one from the whole weights.
  binding_.reset();
  binder_.reset();
  for (auto& stash : stashes_) stash = bert::gpu::part_stash{};
  part_.reset();
  fetcher_.reset();
  grads_.reset();
  partitioned_ = false;
}

} // namespace dsa::train
