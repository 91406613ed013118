// The streamed update; see update_stream.hpp.
#include "actors/train/shard/update_stream.hpp"

#include "io/aio/swap_store.hpp"
#include "optim/partitioned_optimizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace dsa::train {

void update_stream::attach(optim::partitioned_optimizer& part, aio::swap_store& swap) {
  part_ = &part;
  swap_ = &swap;
}

void update_stream::gradients_final(std::uint32_t step, std::uint32_t first) {
  DSA_CHECK(part_ != nullptr, "optimizer shard {}: gradients of step {} before init", participant_, step);
  const auto& tensors = part_->layout().tensors();
  const optim::flat_range mine = part_->partition();
  // Parameter `first` and every later one are final: in this partition, the elements from
  // that parameter's first on (the layout keeps the parameters in their order).
  const std::int64_t flat = first < tensors.size() ? tensors[first].offset : part_->layout().padded_numel();
  const std::int64_t from = std::clamp<std::int64_t>(flat - mine.lo, 0, mine.size());
  frontier_.advance(step, from, mine.size(), first == 0);
  swap_->wake(); // a sweep waiting for these gradients asks again
}

void update_stream::cancel() {
  frontier_.cancel();
  if (swap_) swap_->wake();
}

// The gradients of the partition's elements from `lo` on are final once the parts cover
// them (the parts are a suffix of the layout, growing towards its start).
expected<bool> update_stream::chunk_final(std::uint32_t step, std::int64_t lo) {
  const gradient_frontier::seen s = frontier_.check(step, lo);
  if (s.cancelled)
    return make_error(errc::runtime, "optimizer shard {}: the run stopped during the streamed update of step {}",
                      participant_, step);
  if (!s.final) return false;
  ++chunks_; // on the shard's worker only
  if (s.early) ++early_chunks_;
  return true;
}

bool update_stream::begin(std::uint32_t step, const step_decision& assumed) {
  DSA_CHECK(part_ && !step_, "optimizer shard {}: a streamed update of step {} it cannot stream", participant_, step);
  const bool speculative = decider_.needs_totals();
  if (speculative && last_differed_) {
    ++declined_;
    return false;
  }
  assumed_ = assumed;
  if (speculative) {
    if (auto s = swap_->begin_shadow(); !s)
      throw std::runtime_error(fmt::format("stage {}: streamed update: {}", participant_, s.err().message));
    undo_step_ = part_->step_count();
    undo_beta1_ = part_->settings().beta1;
    undo_beta2_ = part_->settings().beta2;
  }
  speculative_ = speculative;
  return true;
}

optim::chunk_ready update_stream::ready(std::uint32_t step) {
  return [this, step](std::int64_t lo, std::int64_t) { return chunk_final(step, lo); };
}

std::chrono::steady_clock::time_point update_stream::finished(std::uint32_t step,
                                                              std::chrono::steady_clock::time_point started) {
  step_ = step;
  ++streamed_;
  return frontier_.after_backward(started);
}

bool update_stream::settle(std::uint32_t step, const step_decision& would, const step_decision& d) {
  last_differed_ = !step_decider::same_update(would, d);
  const bool streamed = step_ && *step_ == step;
  DSA_CHECK(!step_ || streamed, "optimizer shard {}: update of step {} after streaming step {}", participant_, step,
            *step_);
  step_.reset();
  if (!streamed) return false;
  const bool same = step_decider::same_update(assumed_, d);
  if (!speculative_) {
    if (!same)
      throw std::runtime_error(fmt::format("optimizer shard {}: step {} was streamed with lr {}, but its decision is lr "
                                           "{}, gradient scale {}{}", participant_, step, assumed_.lr, d.lr,
                                           d.grad_scale, d.skip ? ", skipped" : ""));
    return true;
  }
  if (same) {
    if (auto s = swap_->commit_shadow(); !s)
      throw std::runtime_error(fmt::format("ZeRO update of stage {}: {}", participant_, s.err().message));
    return true;
  }
  if (auto s = swap_->discard_shadow(); !s)
    throw std::runtime_error(fmt::format("rolling back stage {}'s streamed update: {}", participant_, s.err().message));
  optim::partition_state undo;
  undo.step = undo_step_;
  part_->restore_state(undo); // the step count only: the state never left its files
  part_->set_betas(undo_beta1_, undo_beta2_);
  ++redone_;
  return false;
}

std::string update_stream::report(std::uint64_t gradient_wait_ns) const {
  std::string line =
      streamed_ > 0 ? fmt::format("; {} updates streamed over the backward: {} of their {} chunk updates began before "
                                  "the step's last gradients were in, {:.3f} s waited for gradients",
                                  streamed_, early_chunks_, chunks_, static_cast<double>(gradient_wait_ns) * 1e-9)
                    : std::string();
  if (streamed_ + declined_ > 0 && decider_.needs_totals())
    line += fmt::format("; clipping: {} streamed updates redone after the norm, {} steps not streamed after a "
                        "clipped one", redone_, declined_);
  return line;
}

} // namespace dsa::train
