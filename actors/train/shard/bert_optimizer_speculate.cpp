// A shard's speculative update and its roll-back; see bert_optimizer.hpp (speculate).
#include "actors/train/shard/bert_optimizer.hpp"

#include "io/aio/swap_store.hpp"

#include <fmt/format.h>

#include <chrono>
#include <stdexcept>

namespace dsa::train {

bool bert_optimizer::speculate(std::uint32_t step) {
  if (comp_ || zchannel_) return false; // its exchanges cannot be taken back
  auto started = std::chrono::steady_clock::now();
  assumed_ = options_.decider->assume();
  back_up();
  advance(step, assumed_);
  speculated_step_ = step;
  ++speculated_;
  if (options_.update_ns)
    *options_.update_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count();
  return true;
}

namespace {
// dst = a copy of src, reusing dst's storage when it fits.
void keep_copy(tensor& dst, const tensor& src) {
  if (!src.defined()) {
    dst = tensor();
    return;
  }
  if (!dst.defined() || dst.type() != src.type() || dst.shape() != src.shape()) dst = tensor::empty(src.shape(), src.type());
  dst.copy_from(src);
}
} // namespace

void bert_optimizer::back_up() {
  backup& b = backup_;
  if (swap_) {
    // Swapped state: the speculative sweeps write to the swap's second files (the state
    // stays as it was until commit_shadow); only the gradients, which the step consumes,
    // and the step count and betas are kept here.
    if (auto s = swap_->begin_shadow(); !s)
      throw std::runtime_error(fmt::format("stage {}: speculative update: {}", options_.participant, s.err().message));
    b.part = optim::partition_state{};
    b.part.step = part_->step_count();
    keep_copy(b.grad, partition_grad());
    b.beta1 = part_->settings().beta1;
    b.beta2 = part_->settings().beta2;
    return;
  }
  if (part_) {
    optim::partition_state live = part_->state();
    keep_copy(b.part.master, live.master);
    keep_copy(b.part.exp_avg, live.exp_avg);
    keep_copy(b.part.exp_avg_sq, live.exp_avg_sq);
    b.part.step = live.step;
    keep_copy(b.grad, partition_grad());
    b.beta1 = part_->settings().beta1;
    b.beta2 = part_->settings().beta2;
    return;
  }
  b.params.resize(slots_.size());
  b.grads.resize(slots_.size());
  b.halves.resize(slots_.size());
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    keep_copy(b.params[i], slots_[i].param);
    keep_copy(b.grads[i], slots_[i].grad);
    keep_copy(b.halves[i], slots_[i].half_copy);
  }
  const optim::optimizer_state live = opt_->state_views();
  for (const auto& [name, t] : live.tensors) keep_copy(b.moments.tensors[name], t);
  b.moments.step = live.step;
  b.beta1 = opt_->settings().beta1;
  b.beta2 = opt_->settings().beta2;
}

void bert_optimizer::roll_back() {
  const backup& b = backup_;
  if (swap_) {
    if (auto s = swap_->discard_shadow(); !s)
      throw std::runtime_error(fmt::format("rolling back stage {}'s speculative update: {}", options_.participant,
                                           s.err().message));
    part_->restore_state(b.part); // the step count only: the state never left its files
    partition_grad().copy_from(b.grad);
    part_->set_betas(b.beta1, b.beta2);
    return;
  }
  if (part_) {
    part_->restore_state(b.part);
    partition_grad().copy_from(b.grad);
    part_->set_betas(b.beta1, b.beta2);
    return;
  }
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].param.copy_from(b.params[i]);
    slots_[i].grad.copy_from(b.grads[i]);
    if (b.halves[i].defined()) slots_[i].half_copy.copy_from(b.halves[i]);
  }
  if (auto s = opt_->load_state(b.moments); !s)
    throw std::runtime_error(fmt::format("rolling back stage {}'s speculative update: {}", options_.participant,
                                         s.err().message));
  opt_->set_betas(b.beta1, b.beta2);
}

} // namespace dsa::train
