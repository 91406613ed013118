// CUDA stage: unpack on the host, run the range on the device, copy what crosses to a
// neighbour (in this process or another) or the reducer.
#include "actors/train/stage/cuda_stage.hpp"

#include "actors/train/config/precision.hpp"
#include "actors/train/stage/step_stats.hpp"

#include "core/device_waits.hpp"
#include "core/log.hpp"
#include "models/bert/bert_part.hpp"
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cstring>
#include <functional>
#include <stdexcept>
#include <string_view>

namespace dsa::train {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(fmt::format("CUDA stage: {} failed: {}", what, cudaGetErrorString(e)));
}

cuda::elem elem_of(dtype t) {
  switch (t) {
  case dtype::f16: return cuda::elem::f16;
  case dtype::bf16: return cuda::elem::bf16;
  default: return cuda::elem::f32;
  }
}

// A (B, T, H) slot tensor of the wire type copied into a device array on `stream`: from
// the device (a neighbour CUDA stage's slot: a device-to-device copy) or from the host (cast
// there first when it came in another type).
bert::gpu::device_array upload(const tensor& slot, dtype wire, std::int64_t elements, cudaStream_t stream,
                               const char* what) {
  if (!slot.defined() || slot.numel() != elements)
    throw std::runtime_error(fmt::format("CUDA stage: the {} is {}, expected {} elements", what,
                                         slot.defined() ? slot.describe() : "(none)", elements));
  const bool on_device = !slot.dev().is_cpu();
  if (on_device && (slot.type() != wire || !slot.is_contiguous()))
    throw std::runtime_error(fmt::format("CUDA stage: the {} is {} on {}, expected contiguous {}", what,
                                         slot.describe(), slot.dev().to_string(), dtype_name(wire)));
  const tensor src = on_device || (slot.type() == wire && slot.is_contiguous()) ? slot : cast_to(slot, wire);
  const auto bytes = static_cast<std::size_t>(elements) * dtype_size(wire);
  bert::gpu::device_array d(bytes, stream);
  check_cuda(cudaMemcpyAsync(d.get(), src.raw_data(), bytes, on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice,
                             stream),
             "taking a slot's tensor");
  return d;
}

// The stage's (B, T, H) of the wire type into the slot tensor `out` (reused when it fits):
// on the stage's device, or in host memory when the neighbour runs in another process
// (`to_host`: only host tensors travel between processes), then a wait: the neighbour reads
// it from its own stream (or the link from the host), and the slot's credit may come back
// only once this stage's reads of its input are done too.
void to_slot(const void* device_ptr, tensor& out, const shape_t& shape, dtype wire, int index, bool to_host,
             cudaStream_t stream) {
  const device where = to_host ? device::cpu() : device::cuda(index);
  if (!out.defined() || out.shape() != shape || out.type() != wire || !out.is_contiguous() || out.dev() != where)
    out = tensor::empty(shape, wire, where);
  check_cuda(cudaMemcpyAsync(out.raw_data(), device_ptr, out.nbytes(),
                             to_host ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice, stream),
             to_host ? "copying a slot to the host for another process" : "filling a slot");
  device_wait("cudaStreamSynchronize (a stage's activation or gradient for a neighbour)");
  check_cuda(cudaStreamSynchronize(stream), "the stage's stream");
}

} // namespace

// The device side of the overlapped gradient download: a copy stream and per ticket an
// event after the compute enqueued so far and one after its copies, which go straight into
// the stage's host gradients (pinned: made by pin_host_gradients).
class cuda_stage::copier final : public grad_copier {
public:
  copier(const bert::gpu::part& part, std::vector<void*> host, cudaStream_t compute)
      : part_(part), host_(std::move(host)), compute_(compute) {
    check_cuda(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "creating the gradient copy stream");
  }
  ~copier() override { // on the stage's device (the stage's destructor sets it)
    if (copy_) cudaStreamSynchronize(copy_); // no copy left writing into the host gradients
    for (cudaEvent_t e : after_compute_) cudaEventDestroy(e);
    for (cudaEvent_t e : copied_) cudaEventDestroy(e);
    if (copy_) cudaStreamDestroy(copy_);
  }
  copier(const copier&) = delete;
  copier& operator=(const copier&) = delete;

  void enqueue(std::size_t ticket, const std::vector<std::size_t>& indices) override {
    while (copied_.size() <= ticket) {
      cudaEvent_t a = nullptr, b = nullptr;
      check_cuda(cudaEventCreateWithFlags(&a, cudaEventDisableTiming), "creating a gradient copy event");
      after_compute_.push_back(a);
      check_cuda(cudaEventCreateWithFlags(&b, cudaEventDisableTiming), "creating a gradient copy event");
      copied_.push_back(b);
    }
    check_cuda(cudaEventRecord(after_compute_[ticket], compute_), "marking a part's backward");
    check_cuda(cudaStreamWaitEvent(copy_, after_compute_[ticket], 0), "ordering a gradient copy");
    for (std::size_t i : indices)
      check_cuda(cudaMemcpyAsync(host_.at(i), part_.gradient_data(i), static_cast<std::size_t>(part_.numel(i)) * 4,
                                 cudaMemcpyDeviceToHost, copy_),
                 "copying a gradient to the host");
    check_cuda(cudaEventRecord(copied_[ticket], copy_), "marking a bucket's copies");
    last_ = static_cast<long>(ticket);
  }
  void wait(std::size_t ticket) override {
    device_wait("cudaEventSynchronize (a part's gradients copied to the host)");
    check_cuda(cudaEventSynchronize(copied_.at(ticket)), "the gradient copies");
  }
  // The compute stream waits for every copy enqueued (before the gradients are zeroed).
  void order_before(cudaStream_t compute) {
    if (last_ >= 0)
      check_cuda(cudaStreamWaitEvent(compute, copied_[static_cast<std::size_t>(last_)], 0),
                 "ordering the gradients' zeroing after their copies");
    last_ = -1;
  }

private:
  const bert::gpu::part& part_;
  std::vector<void*> host_; // each parameter's host gradient (pinned)
  cudaStream_t compute_ = nullptr, copy_ = nullptr;
  std::vector<cudaEvent_t> after_compute_, copied_;
  long last_ = -1; // the last ticket enqueued since the compute stream last waited for the copies
};

// The host gradients are made on the first call on the device (pin_host_gradients): pinned
// when the owner can, not pageable first and pinned after (twice the bytes at the start).
cuda_stage::cuda_stage(const stage_options& options, stage_shared& shared)
    : options_(options), shared_(shared),
      params_(options.model, options.range, working_dtype(options.working), /*gradients=*/false) {}

cuda_stage::~cuda_stage() {
  // The stashes and the part free in stream order on the stage's device.
  if (part_) cudaSetDevice(options_.device_index);
  binding_.reset();
  binder_.reset();
  download_.reset();
  copier_.reset();
  stashes_.clear();
  part_.reset();
}

void cuda_stage::ensure_device() {
  check_cuda(cudaSetDevice(options_.device_index), "cudaSetDevice");
  if (part_) return;
  cuda::install_caching_allocator(); // slot tensors on the device (tensor::empty on cuda:N)
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating the stage's stream");
  stream_ = std::make_unique<cuda::stream_handle>(s);
  // Without f32 masters: the shard keeps them (on the host, or on the GPU in its own arrays);
  // the part holds the working copies it computes with and the f32 gradients (ZeRO-3: of
  // the part it runs, bound by the fetcher's uses).
  part_ = std::make_unique<bert::gpu::part>(params_, elem_of(working_dtype(options_.working)), s,
                                             options_.deterministic, /*masters=*/false, /*resident=*/!fetcher_);
  if (fetcher_) {
    std::vector<std::int64_t> numel;
    std::vector<bool> persistent;
    for (std::size_t t = 0; t < fetcher_->layout().tensors().size(); ++t) {
      numel.push_back(fetcher_->layout().tensors()[t].numel);
      persistent.push_back(fetcher_->persistent(t));
    }
    binder_ = std::make_unique<cuda_zero3_binder>(
        *part_, *grads_, options_.zero3_device_window,
        zero3_upload_bytes(fetch_parts(), numel, persistent, dtype_size(working_dtype(options_.working))));
    binding_ = std::make_unique<zero3_binding>(fetch_parts(), params_.entries().size(), fetcher_.get(), *binder_);
    part_->set_gate(binding_.get());
    return; // no whole host gradients or pinned version: the partition holds both
  }
  pin_host_gradients();
  pin_host_values();
}

namespace {

// A host tensor per parameter of `params` (its shape, `type`), all in one pinned block that
// lives as long as any of them, each filled by fill(i, its memory, its bytes); empty when the
// pinned owner could not pin the block (it has said why).
std::vector<std::pair<std::size_t, tensor>> pinned_per_parameter(const bert::bert_parameters& params, dtype type,
                                                                 const char* what,
                                                                 const std::function<void(std::size_t, void*, std::size_t)>& fill) {
  const auto& entries = params.entries();
  std::size_t bytes = 0;
  std::vector<std::size_t> offsets;
  for (const auto& e : entries) {
    offsets.push_back(bytes);
    bytes += (static_cast<std::size_t>(shape_numel(e.spec.shape)) * dtype_size(type) + 63) / 64 * 64;
  }
  auto block = std::make_shared<bert::gpu::pinned_buffer>();
  block->reserve(bytes, what);
  std::vector<std::pair<std::size_t, tensor>> out;
  if (!block->pinned()) return out;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    void* at = static_cast<char*>(block->get()) + offsets[i];
    const auto n = static_cast<std::size_t>(shape_numel(entries[i].spec.shape)) * dtype_size(type);
    fill(i, at, n);
    auto storage = storage::wrap(at, n, device::cpu(), [block](void*) {});
    out.emplace_back(i, tensor::from_storage(std::move(storage), 0, entries[i].spec.shape, type));
  }
  return out;
}

} // namespace

void cuda_stage::pin_host_gradients() {
  const auto& entries = params_.entries();
  auto grads = pinned_per_parameter(params_, dtype::f32, "a CUDA stage's host gradients",
                                    [](std::size_t, void* at, std::size_t n) { std::memset(at, 0, n); });
  if (grads.empty()) { // the owner has said why; a pageable copy would stall the backward
    log_warn("CUDA stage {}: no pinned host memory for its gradients: they come down after the backward, in one "
             "piece, even where the runtime could take them part by part",
             params_.range().to_string());
    for (std::size_t i = 0; i < entries.size(); ++i)
      grads.emplace_back(i, tensor::zeros(entries[i].spec.shape, dtype::f32));
    params_.set_grads(std::move(grads));
    return;
  }
  std::vector<void*> host;
  for (const auto& g : grads) host.push_back(g.second.raw_data());
  params_.set_grads(std::move(grads));
  copier_ = std::make_unique<copier>(*part_, std::move(host), stream_->get());
  download_ = std::make_unique<grad_download>(entries.size(), [this](std::size_t i) { finish_copy(i); });
}

void cuda_stage::pin_host_values() {
  const auto& entries = params_.entries();
  auto values = pinned_per_parameter(params_, params_.value_type(), "a CUDA stage's host weights",
                                     [&](std::size_t i, void* at, std::size_t n) {
                                       std::memcpy(at, entries[i].value.raw_data(), n);
                                     });
  if (values.empty()) { // the owner has said why: each version's upload then waits for its copies
    log_warn("CUDA stage {}: no pinned host memory for its weights: each version's upload holds the stage's worker "
             "until it is done, instead of overlapping the forward",
             params_.range().to_string());
    return;
  }
  params_.set_values(std::move(values));
}

void cuda_stage::reserve_stash(std::uint32_t slots) { stashes_.resize(slots); }

template <class F> auto cuda_stage::naming_memory(const char* what, std::uint32_t step, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::runtime_error& e) {
    if (std::string_view(e.what()).find("GPU memory:") == std::string_view::npos) throw;
    throw std::runtime_error(fmt::format("{}; while running the {} of step {} on stage {} (model states planned at "
                                         "{} bytes on the device, activations on top)",
                                         e.what(), what, step, params_.range().to_string(),
                                         options_.planned_device_bytes));
  }
}

double cuda_stage::forward(const actors::work_key& key, const std::vector<tensor>& in, const tensor& labels,
                           std::vector<tensor>& out) {
  return naming_memory("forward", key.step, [&] { return forward_on_device(key, in, labels, out); });
}

void cuda_stage::backward(const actors::work_key& key, const tensor& grad_out, tensor& grad_in) {
  naming_memory("backward", key.step, [&] { backward_on_device(key, grad_out, grad_in); });
}

double cuda_stage::forward_on_device(const actors::work_key& key, const std::vector<tensor>& in, const tensor& labels,
                                     std::vector<tensor>& out) {
  stage_timer t{shared_, key.step, stage_shared::phase::forward};
  if (options_.fail_step >= 0 && key.step == static_cast<std::uint64_t>(options_.fail_step))
    throw std::runtime_error("injected fault (debug.fail_step)");
  ensure_device();
  if (fetcher_ && !partitioned_) partition_weights();
  if (binding_) binding_->begin(key.step, false);
  const bert::bert_range& range = params_.range();
  const dtype wire = working_dtype(options_.working);
  const cudaStream_t stream = stream_->get();
  bert::bert_batch batch;
  const tensor in_hidden = read_slot(range, options_.model.head, in, labels, batch);
  spans_.begin(stream, actors::trace_name::gpu_forward, key.step, key.micro_batch);
  bert::gpu::device_array hidden;
  if (in_hidden.defined())
    hidden = upload(in_hidden, wire, batch.batch_size() * batch.seq_length() * options_.model.hidden_size, stream,
                    "previous stage's output");
  bert::forward_context ctx;
  ctx.seed = options_.seed;
  ctx.step = key.step;
  ctx.micro_batch = key.micro_batch + options_.micro_batch_offset;
  ctx.stash_type = wire;
  // DeepSpeed scales each micro-batch loss by 1/M (gradient accumulation) and by the loss
  // scale; the GPU head applies it as its cross entropy leaves the gradient, at the forward
  // (bert_stage at the backward): the same value, since a version (and its scale) loads
  // only when no micro-batch of the stage is in flight.
  const auto grad_scale = static_cast<float>(loss_scale_ / static_cast<double>(options_.micro_batches));
  bert::gpu::part_stash& stash = stashes_.at(key.stash);
  const void* y = part_->forward(std::move(hidden), batch, ctx, grad_scale, stash);
  spans_.end(stream);
  if (range.has_head()) {
    const bert::bert_losses losses = part_->losses(stash);
    spans_.after_wait(stream);
    last_metrics_ = forward_metrics_of(losses);
    return losses.total;
  }
  out.resize(2);
  to_slot(y, out[0], {batch.batch_size(), batch.seq_length(), options_.model.hidden_size}, wire,
          options_.device_index, options_.output_leaves_process, stream);
  spans_.after_wait(stream);
  out[1] = batch.attention_mask; // passed on unchanged (shared, not copied, inside a process)
  return 0.0;
}

void cuda_stage::backward_on_device(const actors::work_key& key, const tensor& grad_out, tensor& grad_in) {
  stage_timer t{shared_, key.step, stage_shared::phase::backward};
  ensure_device();
  const bert::bert_range& range = params_.range();
  const dtype wire = working_dtype(options_.working);
  const cudaStream_t stream = stream_->get();
  step_ = key.step;
  bert::gpu::part_stash& stash = stashes_.at(key.stash);
  if (!stash.filled)
    throw std::runtime_error(fmt::format("CUDA stage {}: backward of step {} micro-batch {} without its forward (stash {})",
                                         range.to_string(), key.step, key.micro_batch, key.stash));
  const shape_t shape{stash.batch, stash.seq, options_.model.hidden_size};
  spans_.begin(stream, actors::trace_name::gpu_backward, key.step, key.micro_batch);
  bert::gpu::device_array dy;
  if (!range.has_head()) dy = upload(grad_out, wire, shape[0] * shape[1] * shape[2], stream, "next stage's gradient");
  grads_on_host_ = false;
  if (download_) download_->begin_step(); // nothing of an earlier step is on the host any more
  // The step's last backward with the runtime listening: each part's gradients are copied
  // on the copy stream behind the part's kernels as the backward is enqueued; once it all
  // is (the GPU runs on), the parts land in order and the runtime hears of each.
  std::vector<std::vector<std::size_t>> parts;
  std::function<void(std::int64_t)> on_enqueued;
  if ((final_ || grads_) && copier_) // ZeRO-2 (grads_): every micro-batch's gradients go to the partition
    on_enqueued = [this, &parts](std::int64_t part) {
      parts.push_back(bert::parameters_finished_by(params_, part));
      download_->final_on_device(parts.back(), *copier_);
    };
  if (binding_) binding_->begin(key.step, true);
  const bert::gpu::device_array dx = part_->backward(dy.get(), stash, on_enqueued);
  spans_.end(stream);
  if (binder_) binder_->finish(); // ZeRO-3: the last part's gradients to the partition
  else if (grads_) submit_partitioned(parts);
  else
    for (const std::vector<std::size_t>& indices : parts) {
      if (indices.empty()) continue;
      (void)download_->ready(indices.front(), *copier_); // waits for the part's copies, rounds them
      for (std::size_t i : indices) final_(i, i + 1);
    }
  if (!range.has_embeddings()) {
    to_slot(dx.get(), grad_in, shape, wire, options_.device_index, options_.grad_in_leaves_process, stream);
    spans_.after_wait(stream);
  } else if (dy.get()) {
    // The first stage reads its gradient slot on its stream: done before its credit returns.
    device_wait("cudaStreamSynchronize (the first stage's read of its gradient slot)");
    check_cuda(cudaStreamSynchronize(stream), "the stage's stream");
    spans_.after_wait(stream);
  }
}

void cuda_stage::finish_copy(std::size_t i) {
  if (grads_) return; // ZeRO-2: the partition rounds each micro-batch's gradient as it sums it
  tensor g = params_.entries()[i].grad; // a handle on the host gradient (the copy's target)
  round_in_place(g, working_dtype(options_.working));
  inject_overflow(options_, step_, i, g);
}

void cuda_stage::fetch_gradients() {
  if (grads_on_host_) return;
  ensure_device();
  std::vector<tensor> grads;
  for (const auto& e : params_.entries()) grads.push_back(e.grad);
  part_->download_gradients(grads);
  spans_.after_wait(stream_->get());
  const dtype wire = working_dtype(options_.working);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    round_in_place(grads[i], wire);
    inject_overflow(options_, step_, i, grads[i]);
  }
  grads_on_host_ = true;
}

std::vector<tensor> cuda_stage::parameters() {
  std::vector<tensor> out;
  for (const auto& e : params_.entries()) out.push_back(e.value);
  return out;
}

std::vector<tensor> cuda_stage::gradients() {
  if (grads_) { // ZeRO-2: this rank's piece of the summed gradients
    grads_->wait();
    std::vector<tensor> out;
    for (std::size_t i = 0; i < params_.entries().size(); ++i) out.push_back(grads_->piece_of(i));
    return out;
  }
  if (download_ && download_->all_enqueued())
    for (std::size_t i = 0; i < params_.entries().size(); ++i) (void)download_->ready(i, *copier_);
  else
    fetch_gradients();
  std::vector<tensor> out;
  for (const auto& e : params_.entries()) out.push_back(e.grad);
  return out;
}

tensor cuda_stage::gradient(std::size_t index) {
  const auto& entries = params_.entries();
  if (index >= entries.size())
    throw std::runtime_error(fmt::format("gradient {} of a stage with {} parameters", index, entries.size()));
  if (grads_) { // ZeRO-2: this rank's piece of the summed gradient
    grads_->wait();
    return grads_->piece_of(index);
  }
  if (!download_ || !download_->ready(index, *copier_)) fetch_gradients();
  return entries[index].grad;
}

void cuda_stage::load_parameters(const std::vector<tensor>& updated) {
  if (fetcher_) {
    // ZeRO-3: this rank's partition of the working weights, then the loss scale; the device
    // holds no weights between steps.
    const double scale = zero3_version_scale(updated);
    ensure_device();
    if (!partitioned_) partition_weights();
    fetcher_->load(updated[0]);
    grads_->reset(); // the reducer has released the step's gradients
    loss_scale_ = scale;
    return;
  }
  if (part_) {
    check_cuda(cudaSetDevice(options_.device_index), "cudaSetDevice");
    part_->wait_upload_read(); // the last version's copies have read the host weights
  }
  const double scale = load_version(params_, updated);
  ensure_device();
  // Uploaded part by part on the part's upload stream; each forward waits for its part only.
  std::vector<tensor> values;
  for (const auto& e : params_.entries()) values.push_back(e.value);
  part_->upload_version(values);
  if (copier_) copier_->order_before(stream_->get());
  if (download_) download_->begin_step(); // the host copies are the old version's
  if (grads_) grads_->reset();            // ZeRO-2: the reducer has released the step's partition
  part_->zero_gradients();
  grads_on_host_ = false;
  loss_scale_ = scale;
}

void cuda_stage::enable_partitioned_grads(std::shared_ptr<partition_grads> grads) {
  if (!grads) throw std::runtime_error(fmt::format("CUDA stage {}: no gradient partition", params_.range().to_string()));
  grads_ = std::move(grads);
}

void cuda_stage::submit_partitioned(const std::vector<std::vector<std::size_t>>& parts) {
  const auto& entries = params_.entries();
  auto submit = [&](std::size_t i) { // a copy of its own: the host gradient is the next micro-batch's target
    tensor own = tensor::empty(entries[i].grad.shape(), dtype::f32);
    std::memcpy(own.raw_data(), entries[i].grad.raw_data(), own.nbytes());
    grads_->submit(i, std::move(own), step_);
  };
  if (parts.empty()) { // no pinned copies: the whole set at once, then each tensor
    std::vector<tensor> host;
    for (const auto& e : entries) host.push_back(e.grad);
    part_->download_gradients(host);
    for (std::size_t i = 0; i < entries.size(); ++i) submit(i);
  } else {
    for (const std::vector<std::size_t>& indices : parts) {
      if (indices.empty()) continue;
      (void)download_->ready(indices.front(), *copier_); // waits for the part's copies
      for (std::size_t i : indices) submit(i);
    }
    copier_->order_before(stream_->get());
  }
  part_->zero_gradients(); // the next micro-batch's gradients start from zero
}

} // namespace dsa::train
