// One stage's optimizer shard.
#include "actors/train/bert_optimizer.hpp"

#include "optim/grad_clip.hpp"

#include <chrono>
#include <cmath>
#include <stdexcept>

namespace dsa::train {

bert_optimizer::bert_optimizer(bert_optimizer_options options) : options_(std::move(options)) {
  DSA_CHECK(options_.decider != nullptr, "optimizer shard {}: no step decider", options_.participant);
}

void bert_optimizer::init(const std::vector<tensor>& initial) {
  const auto& specs = options_.specs;
  DSA_CHECK(initial.size() == specs.size(), "optimizer shard {}: {} initial tensors for {} parameters",
            options_.participant, initial.size(), specs.size());
  dtype half = working_dtype(options_.working);
  slots_.clear();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    optim::param_slot s;
    s.name = specs[i].name;
    auto resumed = options_.resume_masters.find(s.name);
    if (!options_.resume_masters.empty()) {
      if (resumed == options_.resume_masters.end())
        throw std::runtime_error("checkpoint has no master weights for " + s.name);
      s.param = cast_to(resumed->second, dtype::f32);
    } else {
      s.param = cast_to(initial[i], dtype::f32);
    }
    s.grad = tensor::zeros(s.param.shape(), dtype::f32);
    if (half != dtype::f32) s.half_copy = cast_to(s.param, half);
    slots_.push_back(s);
  }
  // Groups hold copies of the slots: tensors are shared, so updates land in slots_ too.
  auto groups = optim::bert_param_groups(slots_, options_.optimizer.weight_decay, options_.optimizer.lr);
  auto created = optim::optimizer::create(options_.optimizer, std::move(groups));
  if (!created) throw std::runtime_error(created.err().message);
  opt_.emplace(std::move(*created));
  if (options_.resume_state) {
    auto loaded = opt_->load_state(*options_.resume_state);
    if (!loaded) throw std::runtime_error(loaded.err().message);
  }
}

std::vector<tensor> bert_optimizer::gradient_buffers() {
  std::vector<tensor> out;
  for (const auto& s : slots_) out.push_back(s.grad);
  return out;
}

bool bert_optimizer::update(std::uint32_t step, const actors::grad_totals& totals, std::vector<tensor>& out) {
  auto started = std::chrono::steady_clock::now();
  if (options_.fail_step >= 0 && step == static_cast<std::uint64_t>(options_.fail_step))
    throw std::runtime_error("injected fault (debug.fail_optimizer_step)");
  const step_decision d = options_.decider->decide(step, totals);
  if (!d.skip) {
    for (auto& s : slots_) optim::scale_in_place(s.grad, d.grad_scale);
    opt_->set_lr(d.lr);
    if (d.set_betas) opt_->set_betas(d.beta1, d.beta2);
    opt_->step();
  }
  write_working(out);
  out.push_back(loss_scale_tensor(d.loss_scale_after)); // the next step's, for the stage's backward
  last_ = d;
  if (options_.update_ns)
    *options_.update_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count();
  return !d.skip;
}

void bert_optimizer::write_working(std::vector<tensor>& out) {
  out.resize(slots_.size());
  version_bytes_ = 0;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    const tensor& src = slots_[i].half_copy.defined() ? slots_[i].half_copy : slots_[i].param;
    if (!out[i].defined() || out[i].type() != src.type() || out[i].shape() != src.shape())
      out[i] = tensor::empty(src.shape(), src.type());
    out[i].copy_from(src);
    version_bytes_ += static_cast<std::int64_t>(out[i].nbytes());
  }
}

shard_bytes bert_optimizer::held_bytes() const {
  shard_bytes b;
  for (const auto& s : slots_) {
    b.gradients += static_cast<std::int64_t>(s.grad.nbytes());
    b.masters += static_cast<std::int64_t>(s.param.nbytes());
    if (s.half_copy.defined()) b.half_masters += static_cast<std::int64_t>(s.half_copy.nbytes());
  }
  // The moments live in the optimizer's own slots (it allocates them).
  if (opt_)
    for (const auto& g : opt_->groups())
      for (const auto& s : g.params) b.moments += static_cast<std::int64_t>(s.m.nbytes() + s.v.nbytes());
  b.version = version_bytes_;
  return b;
}

state_payload bert_optimizer::payload() const {
  state_payload p;
  for (const auto& s : slots_) p["master." + s.name] = s.param; // views: no copy of the shard's state
  optim::optimizer_state st = opt_->state_views();
  for (auto& [name, t] : st.tensors) p[name] = std::move(t);
  tensor count = tensor::empty({1}, dtype::i64);
  count.data<std::int64_t>()[0] = st.step;
  p["optimizer_step_count"] = count;
  return p;
}

} // namespace dsa::train
