// A pipeline stage running a contiguous range of BERT (models/bert bert_part)
// behind the runtime's stage_compute interface. With fp16/bf16 the stage's
// working weights are f16/bf16 tensors (widened to f32 one layer at a time while
// it computes), its stashed activations are f16/bf16, and the activations and
// activation-gradients it sends are half precision. Parameter gradients
// accumulate in f32 over the micro-batches and are rounded to half in place
// once per step, when the reducer takes them (no second copy).
#pragma once

#include "actors/train/config/precision.hpp"
#include "actors/train/data/batch_packing.hpp"
#include "actors/train/stage/step_stats.hpp"
#include "actors/train/stage/zero3_binding.hpp"
#include "actors/train/stage/partition_grads.hpp"
#include "actors/train/stage/model_stage.hpp"
#include "actors/train/stage/param_fetcher.hpp"
#include "models/bert/bert_part.hpp"
#include "models/bert/weight_grads.hpp"

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

namespace dsa::train {

class bert_stage final : public model_stage {
public:
  bert_stage(const stage_options& options, stage_shared& shared);
  ~bert_stage() override;

  // The model range; its parameter values are in the working precision.
  bert::bert_part& part() { return part_; }
  bert::bert_parameters& named_parameters() override { return part_.parameters(); }

  void reserve_stash(std::uint32_t slots) override;
  // Slots between stages hold the hidden states (working precision) and the
  // micro-batch's f32 attention mask (B, T) as a rider.
  double forward(const actors::work_key& key, const std::vector<tensor>& in, const tensor& labels,
                 std::vector<tensor>& out) override;
  void backward(const actors::work_key& key, const tensor& grad_out, tensor& grad_in) override;
  // Zero-bubble: backward() defers its weight-gradient products (models/bert/weight_grads.hpp)
  // into the stash slot's list, which weight() runs.
  void split_backward() override { split_ = true; }
  void weight(const actors::work_key& key) override;
  // The working weights (views, in the working precision) and f32 gradients.
  std::vector<tensor> parameters() override;
  std::vector<tensor> gradients() override;
  // One accumulated gradient, rounded in place to the working precision.
  tensor gradient(std::size_t index) override;
  // Reports, during the step's last backward, the head's, each layer's and the
  // embeddings' parameters as their gradients complete.
  void set_gradients_final(gradients_final_fn listener) override { final_ = std::move(listener); }
  void load_parameters(const std::vector<tensor>& updated) override;
  // The head's losses and accuracy counts of the last forward (forward_metrics_of);
  // none on stages without the head.
  std::vector<double> forward_metrics() override {
    std::vector<double> taken;
    taken.swap(last_metrics_);
    return taken;
  }

  // ZeRO stage 3: from the first forward on, the stage holds only its partition of the
  // working weights (and the persistent small tensors) in `fetcher`, which gathers each
  // part's weights as the model enters it and frees them as it leaves; parameter versions
  // are then the shard's partition and the loss scale. The gradients of a part exist only
  // from its backward until `grads` has summed them into this rank's partition (after the
  // part's last backward use in the micro-batch); the stage then publishes that partition
  // (gradients_reduced). Before the run.
  void enable_zero3(std::shared_ptr<param_fetcher> fetcher, std::shared_ptr<partition_grads> grads) override;
  // ZeRO stage 2 on one pipeline stage: the same gradient partition, weights whole.
  void enable_partitioned_grads(std::shared_ptr<partition_grads> grads) override;
  bool gradients_reduced() const override { return grads_ != nullptr; }
  // The parts and their order as the fetcher needs them (param_fetcher.hpp): the
  // embeddings, each layer and the head with their parameters (the head also the tied
  // word embedding), and one micro-batch's forward then backward.
  std::vector<fetch_part> fetch_parts() const override;
  std::vector<std::int64_t> fetch_sequence() const override;
  // ZeRO-3, after the run, on every rank at once: gathers the whole working weights back
  // into the stage (for the evaluation). Nothing without ZeRO-3.
  void gather_whole() override;
  const param_fetcher* fetcher() const override { return fetcher_.get(); }
  // ZeRO-3: the fetcher gathers a step's weights only once the step is allowed.
  void allow(std::uint32_t step) override {
    if (fetcher_) fetcher_->allow(step);
    if (grads_) grads_->allow(step);
  }
  void cancel() override {
    if (fetcher_) fetcher_->cancel();
    if (grads_) grads_->cancel();
  }
  // ZeRO-3: the gradient partition's bytes (0 otherwise).
  std::int64_t partition_grad_bytes() const override { return grads_ ? grads_->bytes() : 0; }

  // The loss scale the head's backward applies: set before the run (the
  // resumed or initial scale), then by each parameter version, whose last
  // tensor is the next step's scale (see loss_scale_tensor). Read and written
  // on the stage's worker only.
  double& loss_scale() override { return loss_scale_; }

private:
  stage_options options_;
  stage_shared& shared_;
  bert::bert_part part_;
  std::vector<bert::part_stash> stashes_;
  bool split_ = false;
  std::vector<bert::deferred_weight_grads> deferred_; // per stash slot, with split_
  double loss_scale_ = 1.0;
  std::vector<double> last_metrics_;
  gradients_final_fn final_;
  // ZeRO-3 and ZeRO-2 on one stage: each part's weights and gradients bound while the model
  // runs it (zero3_binding.hpp), into part_'s parameters.
  std::shared_ptr<param_fetcher> fetcher_;
  std::shared_ptr<partition_grads> grads_;
  class host_binder;
  std::unique_ptr<host_binder> binder_;
  std::unique_ptr<zero3_binding> binding_;
  bool partitioned_ = false; // the stage's whole weights were handed to the fetcher
  std::uint32_t step_ = 0;   // the step of the forward or backward running (for the fetcher)
  void partition_weights();
};

} // namespace dsa::train
