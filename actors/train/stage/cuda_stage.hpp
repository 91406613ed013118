// A pipeline stage computing its range of BERT on a GPU (models/bert/cuda_part.hpp) behind
// the runtime's stage_compute interface: bert_stage's twin for devices.backend = "cuda"
// (CUDA builds only; make_stage picks it).
//
// The stage keeps the range's parameters twice: on the device (the working copies the
// kernels read, f32 for vectors and with f32 storage, and f32 gradients: the part's, made
// without f32 masters, which the shard keeps) and on the host in the working precision
// (named_parameters(), which the run initialises, loads checkpoints into and evaluates).
// The device copy is made from the host's at the first call on the stage's worker, so
// what the run wrote before the steps is what the GPU computes with; each parameter
// version the shard publishes is written into the host copy and uploaded. The slots
// between stages of one process stay on the device: a stage's output and input gradient
// are device tensors (cuda:N, working precision) that the neighbour copies into its stash
// on its own stream (the mask rides on the host); towards a neighbour in another process
// (stages across processes) they are host tensors, which the link sends and the receiving
// stage uploads. The gradients the reducer takes are host tensors, as
// on a CPU rank: downloaded once per step, when the reducer first asks, then rounded to the
// working precision in place, as bert_stage does. Every call runs on the stage's compute worker (never a CAF thread),
// sets the stage's device first, and enqueues on the stage's own stream; the worker waits
// for the stream only where a host tensor must be read (the head's losses, an output or
// input gradient for a neighbour, the gradients). When the run is traced, each job's
// kernels become a device span (gpu_spans.hpp), recorded at the next of those waits.
//
// ZeRO-3 (enable_zero3): the part is made without resident parameters; the stage's host
// weights go to the parameter fetcher at the first step, and each part of the range has its
// gathered weights on the device only while it runs (cuda_zero3.hpp), its gradients summed
// into the rank's partition per micro-batch.
#pragma once

#include "actors/train/stage/gpu_spans.hpp"
#include "actors/train/stage/cuda_zero3.hpp"
#include "actors/train/stage/grad_download.hpp"
#include "actors/train/stage/partition_grads.hpp"
#include "actors/train/stage/model_stage.hpp"
#include "kernels/cuda/device_context.hpp"
#include "models/bert/cuda_part.hpp"

#include <memory>
#include <vector>

namespace dsa::train {

class cuda_stage final : public model_stage {
public:
  cuda_stage(const stage_options& options, stage_shared& shared);
  ~cuda_stage() override;

  bert::bert_parameters& named_parameters() override { return params_; }
  double& loss_scale() override { return loss_scale_; }

  void reserve_stash(std::uint32_t slots) override;
  double forward(const actors::work_key& key, const std::vector<tensor>& in, const tensor& labels,
                 std::vector<tensor>& out) override;
  void backward(const actors::work_key& key, const tensor& grad_out, tensor& grad_in) override;
  std::vector<double> forward_metrics() override {
    std::vector<double> taken;
    taken.swap(last_metrics_);
    return taken;
  }
  // The host copies: the working weights, and the f32 gradients downloaded and rounded
  // to the working precision in place.
  std::vector<tensor> parameters() override;
  std::vector<tensor> gradients() override;
  tensor gradient(std::size_t index) override;
  void load_parameters(const std::vector<tensor>& updated) override;
  // When the runtime listens (overlap_comm over several buckets, a streamed update), the
  // step's last backward copies each part's gradients to the host on a copy stream behind
  // the part's kernels while the backward is enqueued; then, the whole backward queued, it
  // waits for the parts in order and tells the runtime of each (grad_download.hpp), so the
  // reducer and the CPU shard's update start while the GPU finishes. Without pinned host
  // memory the gradients come down at once after the backward.
  void set_gradients_final(gradients_final_fn listener) override { final_ = std::move(listener); }
  // The run's recorder: each forward's and backward's kernels become a device span
  // (gpu_forward, gpu_backward) on the stage's actor (gpu_spans.hpp).
  void trace_attach(actors::trace_recorder* trace, std::uint32_t actor, std::int32_t stage) override {
    spans_.attach(trace, actor, stage);
  }

  // ZeRO-3: before the stage's first use of its device (the part is then made without
  // resident parameters).
  void enable_zero3(std::shared_ptr<param_fetcher> fetcher, std::shared_ptr<partition_grads> grads) override;
  // ZeRO-2 on one pipeline stage: after each micro-batch's backward its gradients, part by
  // part as their copies land, are summed over the ranks into this rank's partition
  // (partition_grads, on the host), and the device's are zeroed for the next micro-batch.
  void enable_partitioned_grads(std::shared_ptr<partition_grads> grads) override;
  bool gradients_reduced() const override { return grads_ != nullptr; }
  void allow(std::uint32_t step) override {
    if (fetcher_) fetcher_->allow(step);
    if (grads_) grads_->allow(step);
  }
  void cancel() override {
    if (fetcher_) fetcher_->cancel();
    if (grads_) grads_->cancel();
  }
  std::vector<fetch_part> fetch_parts() const override { return zero3_parts(params_); }
  std::vector<std::int64_t> fetch_sequence() const override { return zero3_sequence(fetch_parts()); }
  // After the run: the whole weights gathered into the host copy; the device part is made
  // again (resident) at its next use.
  void gather_whole() override;
  const param_fetcher* fetcher() const override { return fetcher_.get(); }
  std::int64_t partition_grad_bytes() const override { return grads_ ? grads_->bytes() : 0; }

private:
  double forward_on_device(const actors::work_key& key, const std::vector<tensor>& in, const tensor& labels,
                           std::vector<tensor>& out);
  void backward_on_device(const actors::work_key& key, const tensor& grad_out, tensor& grad_in);
  // f(), an out-of-memory error from it ("GPU memory: ...") rethrown naming the job, the
  // step, the stage and its planned device bytes.
  template <class F> auto naming_memory(const char* what, std::uint32_t step, F&& f) -> decltype(f());
  // Sets the stage's device on the calling thread; on the first call makes the stream and
  // the device copy of the parameters.
  void ensure_device();
  void fetch_gradients();
  // The host gradients moved into one pinned block (so copies from the device are
  // asynchronous), and the copier and its download over them; without pinned memory (said
  // in the log) the gradients stay pageable and come down after the backward.
  void pin_host_gradients();
  // The host weights (each version's, in the working precision) moved into one pinned block,
  // so the part's upload of a version is asynchronous; pageable when pinning fails (said).
  void pin_host_values();
  // Parameter i's gradient on the host: rounded to the working precision (and
  // debug.overflow_step's fault), as fetch_gradients does.
  void finish_copy(std::size_t i);
  // ZeRO-2: a micro-batch's gradients into the partition, by the parts whose copies were
  // enqueued (none: downloaded at once), then the device's zeroed.
  void submit_partitioned(const std::vector<std::vector<std::size_t>>& parts);
  // ZeRO-3: the stage's host weights handed to the fetcher and dropped (at the first step).
  void partition_weights();
  stage_options options_;
  stage_shared& shared_;
  bert::bert_parameters params_;
  std::unique_ptr<cuda::stream_handle> stream_; // before the part: destroyed after it
  std::unique_ptr<bert::gpu::part> part_;
  gpu_spans spans_;
  std::vector<bert::gpu::part_stash> stashes_;
  double loss_scale_ = 1.0;
  std::vector<double> last_metrics_;
  bool grads_on_host_ = false; // the host gradients hold the device's since the last backward
  std::uint32_t step_ = 0;     // the step of the last backward (debug.overflow_step)
  gradients_final_fn final_;  // set by the runtime around the step's last backward
  class copier;
  std::unique_ptr<copier> copier_;
  std::unique_ptr<grad_download> download_;
  std::shared_ptr<partition_grads> grads_; // ZeRO-2 on one pipeline stage, and ZeRO-3
  std::shared_ptr<param_fetcher> fetcher_; // ZeRO-3
  std::unique_ptr<cuda_zero3_binder> binder_;
  std::unique_ptr<zero3_binding> binding_;
  bool partitioned_ = false; // ZeRO-3: the host weights went to the fetcher
};

} // namespace dsa::train
