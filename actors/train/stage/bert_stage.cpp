// BERT stage: unpack, run the range, convert what crosses to a neighbour.
#include "actors/train/stage/bert_stage.hpp"

#include "kernels/cpu/convert.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace dsa::train {

bert_stage::bert_stage(const stage_options& options, stage_shared& shared)
    : options_(options), shared_(shared),
      part_(options.model, options.range, working_dtype(options.working), options.whole_gradients,
            options.make_value) {
  // The maker holds the start-up weights' file: it goes once the values partitioned away do.
  options_.make_value = nullptr;
}

void bert_stage::reserve_stash(std::uint32_t slots) { stashes_.resize(slots); }


double bert_stage::forward(const actors::work_key& key, const std::vector<tensor>& in, const tensor& labels,
                           std::vector<tensor>& out) {
  stage_timer t{shared_, key.step, stage_shared::phase::forward};
  if (grads_ && !partitioned_) partition_weights();
  step_ = key.step;
  if (binding_) binding_->begin(key.step, false);
  if (options_.fail_step >= 0 && key.step == static_cast<std::uint64_t>(options_.fail_step))
    throw std::runtime_error("injected fault (debug.fail_step)");
  bert::bert_batch batch;
  tensor hidden = read_slot(part_.range(), options_.model.head, in, labels, batch);
  if (hidden.defined() && hidden.type() != dtype::f32) hidden = cast_to(hidden, dtype::f32);
  bert::forward_context ctx;
  ctx.seed = options_.seed;
  ctx.step = key.step;
  ctx.micro_batch = key.micro_batch + options_.micro_batch_offset;
  ctx.stash_type = working_dtype(options_.working);
  auto result = part_.forward(hidden, batch, ctx, stashes_.at(key.stash));
  if (!result) throw std::runtime_error(result.err().message);
  if (part_.range().has_head()) {
    last_metrics_ = forward_metrics_of(result->losses);
    return result->losses.total;
  }
  dtype wire = working_dtype(options_.working);
  out.resize(2);
  if (wire == dtype::f32) out[0] = result->hidden;
  else cast_into(out[0], result->hidden, wire);
  out[1] = batch.attention_mask; // passed on unchanged (shared, not copied, inside a process)
  return 0.0;
}

void bert_stage::backward(const actors::work_key& key, const tensor& grad_out, tensor& grad_in) {
  stage_timer t{shared_, key.step, stage_shared::phase::backward};
  step_ = key.step;
  tensor dout;
  if (grad_out.defined()) dout = grad_out.type() == dtype::f32 ? grad_out : cast_to(grad_out, dtype::f32);
  bert::backward_options opt;
  // DeepSpeed scales each micro-batch loss by 1/M (gradient accumulation) and by the loss scale.
  opt.loss_scale = static_cast<float>(loss_scale_ / static_cast<double>(options_.micro_batches));
  if (final_ && !grads_)
    opt.on_done = [this](std::int64_t part) {
      for (std::size_t i : bert::parameters_finished_by(part_.parameters(), part)) final_(i, i + 1);
    };
  if (binding_) binding_->begin(key.step, true);
  tensor dx;
  if (split_) {
    if (deferred_.size() < stashes_.size()) deferred_.resize(stashes_.size());
    bert::defer_weight_grads defer(deferred_.at(key.stash));
    dx = part_.backward(dout, stashes_.at(key.stash), opt);
  } else {
    dx = part_.backward(dout, stashes_.at(key.stash), opt);
  }
  if (!part_.range().has_embeddings()) {
    dtype wire = working_dtype(options_.working);
    if (wire == dtype::f32) grad_in = dx;
    else cast_into(grad_in, dx, wire);
  }
}

void bert_stage::weight(const actors::work_key& key) {
  stage_timer t{shared_, key.step, stage_shared::phase::backward};
  DSA_CHECK(split_ && key.stash < deferred_.size(), "bert stage {}: W work of step {} micro-batch {} without its B",
            part_.range().to_string(), key.step, key.micro_batch);
  deferred_[key.stash].run(); // empty when the micro-batch's B had no weight-gradient product
}

std::vector<tensor> bert_stage::parameters() {
  std::vector<tensor> out;
  for (const auto& e : part_.parameters().entries()) out.push_back(e.value);
  return out;
}

tensor bert_stage::gradient(std::size_t index) {
  const auto& entries = part_.parameters().entries();
  if (index >= entries.size())
    throw std::runtime_error(fmt::format("gradient {} of a stage with {} parameters", index, entries.size()));
  if (grads_) { // ZeRO-3: this rank's piece of the summed gradient
    grads_->wait();
    return grads_->piece_of(index);
  }
  tensor g = entries[index].grad;
  round_in_place(g, working_dtype(options_.working));
  inject_overflow(options_, step_, index, g);
  return g;
}

std::vector<tensor> bert_stage::gradients() {
  // The f32 accumulators themselves, rounded to the working precision: the values
  // a half-precision gradient would carry, without a second tensor (the rounding
  // goes through a bounded scratch buffer). The stage
  // touches them again only when it loads the next version (zeroing them), after
  // the reducer has given them back.
  const dtype wire = working_dtype(options_.working);
  std::vector<tensor> out;
  if (grads_) {
    for (std::size_t i = 0; i < part_.parameters().entries().size(); ++i) out.push_back(gradient(i));
    return out;
  }
  for (const auto& e : part_.parameters().entries()) {
    tensor g = e.grad;
    round_in_place(g, wire);
    inject_overflow(options_, step_, out.size(), g);
    out.push_back(g);
  }
  return out;
}

void bert_stage::enable_zero3(std::shared_ptr<param_fetcher> fetcher, std::shared_ptr<partition_grads> grads) {
  DSA_CHECK(fetcher && fetcher->layout().tensors().size() == part_.parameters().entries().size(),
            "stage {}: a parameter fetcher for another layout", part_.range().to_string());
  fetcher_ = std::move(fetcher);
  enable_partitioned_grads(std::move(grads));
}

// The CPU's bindings: the part's host tensors; final gradients go to the partition.
class bert_stage::host_binder final : public zero3_binder {
public:
  host_binder(bert::bert_parameters& params, partition_grads& grads) : params_(params), grads_(grads) {}
  void bind_values(std::vector<std::pair<std::size_t, tensor>> values) override { params_.set_values(std::move(values)); }
  void unbind_values(const std::vector<std::size_t>& indices) override {
    std::vector<std::pair<std::size_t, tensor>> dropped;
    for (std::size_t i : indices) dropped.emplace_back(i, tensor{});
    params_.set_values(std::move(dropped));
  }
  void bind_gradients(const std::vector<std::size_t>& indices) override {
    std::vector<std::pair<std::size_t, tensor>> fresh;
    for (std::size_t i : indices) fresh.emplace_back(i, tensor::zeros(params_.entries()[i].spec.shape, dtype::f32));
    params_.set_grads(std::move(fresh));
  }
  void hand_over(const std::vector<std::size_t>& indices, std::uint32_t step) override {
    // Unbind the final gradients, then hand them over (the submits' references free them).
    std::vector<tensor> taken;
    std::vector<std::pair<std::size_t, tensor>> unbound;
    for (std::size_t i : indices) {
      taken.push_back(params_.entries()[i].grad);
      unbound.emplace_back(i, tensor{});
    }
    params_.set_grads(std::move(unbound));
    for (std::size_t k = 0; k < taken.size(); ++k) grads_.submit(indices[k], std::move(taken[k]), step);
  }

private:
  bert::bert_parameters& params_;
  partition_grads& grads_;
};

bert_stage::~bert_stage() = default;

void bert_stage::enable_partitioned_grads(std::shared_ptr<partition_grads> grads) {
  DSA_CHECK(grads != nullptr, "stage {}: no gradient partition", part_.range().to_string());
  grads_ = std::move(grads);
  binder_ = std::make_unique<host_binder>(part_.parameters(), *grads_);
  binding_ = std::make_unique<zero3_binding>(fetch_parts(), part_.parameters().entries().size(), fetcher_.get(),
                                             *binder_);
  part_.set_gate(binding_.get());
}

void bert_stage::partition_weights() {
  auto& params = part_.parameters();
  if (fetcher_) hand_weights_to(*fetcher_, params, parameters());
  std::vector<std::pair<std::size_t, tensor>> dropped;
  for (std::size_t i = 0; i < params.entries().size(); ++i) dropped.emplace_back(i, tensor{});
  params.set_grads(std::move(dropped)); // from now on a part's gradients exist during its backward only
  partitioned_ = true;
}

std::vector<fetch_part> bert_stage::fetch_parts() const { return zero3_parts(part_.parameters()); }

std::vector<std::int64_t> bert_stage::fetch_sequence() const { return zero3_sequence(fetch_parts()); }

void bert_stage::gather_whole() {
  if (!fetcher_) return;
  take_weights_back(*fetcher_, part_.parameters());
  part_.set_gate(nullptr);
  binding_.reset();
  binder_.reset();
  fetcher_.reset();
  grads_.reset();
  partitioned_ = false;
}

void bert_stage::load_parameters(const std::vector<tensor>& updated) {
  auto& params = part_.parameters();
  if (fetcher_) {
    // ZeRO-3: this rank's partition of the working weights, then the loss scale.
    const double scale = zero3_version_scale(updated);
    if (!partitioned_) partition_weights();
    fetcher_->load(updated[0]);
    grads_->reset(); // the reducer has released the step's gradients
    loss_scale_ = scale;
    return;
  }
  const double scale = load_version(params, updated);
  if (grads_) grads_->reset(); // ZeRO-2, one stage: the reducer has released the step's partition
  else params.zero_grad();
  loss_scale_ = scale;
}

} // namespace dsa::train
