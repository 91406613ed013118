// A shard's update streamed over the backward; see bert_optimizer.hpp (stream_elements).
#include "actors/train/shard/bert_optimizer.hpp"

#include "io/aio/swap_store.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace dsa::train {

std::int64_t bert_optimizer::stream_elements() const {
  const auto type = options_.optimizer.type;
  const bool adam = type == optim::optimizer_type::adam || type == optim::optimizer_type::adamw;
  // With loss scaling the gradients are unscaled in place by the update (a redo would
  // need a copy of them): not streamed. Clipping is: speculatively (stream_update).
  if (!options_.offload || !adam || options_.decider->loss_scaling() || options_.fetcher ||
      options_.partition_parameters || options_.whole_gradient >= 0 || options_.exchanges_tied ||
      options_.shared_gradients.defined()) // a tied exchange, or a stage summing its gradient partition itself
    return 0;
  // Buckets of a quarter chunk: a chunk is final soon after the backward finished it,
  // whatever the buckets' boundaries.
  return std::max<std::int64_t>(options_.offload->sub_group / 4, 1);
}

void bert_optimizer::gradients_final(std::uint32_t step, std::uint32_t first) {
  DSA_CHECK(part_.has_value(), "optimizer shard {}: gradients of step {} before init", options_.participant, step);
  const auto& tensors = part_->layout().tensors();
  const optim::flat_range mine = part_->partition();
  // Parameter `first` and every later one are final: in this partition, the elements from
  // that parameter's first on (the layout keeps the parameters in their order).
  const std::int64_t flat = first < tensors.size() ? tensors[first].offset : part_->layout().padded_numel();
  const std::int64_t from = std::clamp<std::int64_t>(flat - mine.lo, 0, mine.size());
  stream_gate& g = *gate_;
  {
    std::lock_guard<std::mutex> lock(g.mu);
    if (!g.open || g.step != step) {
      g.open = true;
      g.step = step;
      g.ready_from = mine.size();
      g.all_final = false;
    }
    g.ready_from = std::min(g.ready_from, from);
    if (first == 0) {
      g.all_final = true;
      g.all_final_at = std::chrono::steady_clock::now();
    }
  }
  if (swap_) swap_->wake(); // a sweep waiting for these gradients asks again
}

void bert_optimizer::cancel() {
  {
    std::lock_guard<std::mutex> lock(gate_->mu);
    gate_->cancelled = true;
  }
  if (swap_) swap_->wake();
}

// Asked by the swap store's sweep (on the shard's worker, under the store's lock) before
// each chunk: the gradients of the partition's elements from `lo` on are final once the
// parts cover them (the parts are a suffix of the layout, growing towards its start).
expected<bool> bert_optimizer::chunk_final(std::uint32_t step, std::int64_t lo) {
  stream_gate& g = *gate_;
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.cancelled)
    return make_error(errc::runtime, "optimizer shard {}: the run stopped during the streamed update of step {}",
                      options_.participant, step);
  if (!g.open || g.step != step || g.ready_from > lo) return false;
  ++streamed_chunks_;
  if (!g.all_final) ++early_chunks_;
  return true;
}

bool bert_optimizer::stream_update(std::uint32_t step) {
  DSA_CHECK(stream_elements() > 0 && part_ && swap_ && !streamed_step_ && !speculated_step_,
            "optimizer shard {}: a streamed update of step {} it cannot stream", options_.participant, step);
  // With clipping the update streams on the assumption that it does not clip, writing the
  // swap's second files (swap_store::begin_shadow); update() keeps them, or forgets them
  // and redoes the step from the state's own files. A step right after one that clipped
  // is likely to clip too: it waits for the norm instead.
  const bool speculative = options_.decider->needs_totals();
  if (speculative && last_differed_) {
    ++stream_declined_;
    return false;
  }
  const auto started = std::chrono::steady_clock::now();
  assumed_ = options_.decider->assume();
  if (speculative) {
    if (auto s = swap_->begin_shadow(); !s)
      throw std::runtime_error(fmt::format("stage {}: streamed update: {}", options_.participant, s.err().message));
    stream_undo_.step = part_->step_count();
    stream_undo_.beta1 = part_->settings().beta1;
    stream_undo_.beta2 = part_->settings().beta2;
  }
  stream_speculative_ = speculative;
  stream_ready_ = [this, step](std::int64_t lo, std::int64_t) { return chunk_final(step, lo); };
  struct clear_hook {
    optim::chunk_ready& hook;
    ~clear_hook() { hook = nullptr; }
  } clear{stream_ready_};
  advance(step, assumed_); // the sweep waits in stream_ready_ for each chunk's gradients
  streamed_step_ = step;
  ++streamed_;
  if (options_.update_ns) {
    // wall_clock_breakdown's optimizer time: what the update added after the backward,
    // from the step's last part on.
    std::lock_guard<std::mutex> lock(gate_->mu);
    const auto from = gate_->all_final ? std::max(started, gate_->all_final_at) : started;
    *options_.update_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - from).count();
  }
  return true;
}

// update() of a streamed step: keeps the streamed update when the decision is the one
// assumed; otherwise, when it was speculative, forgets it (the gradients were not
// touched: no scaling was assumed) and returns false for update() to redo the step.
bool bert_optimizer::settle_stream(std::uint32_t step, const step_decision& d) {
  const bool same = step_decider::same_update(assumed_, d);
  if (!stream_speculative_) {
    if (!same)
      throw std::runtime_error(fmt::format("optimizer shard {}: step {} was streamed with lr {}, but its decision is lr "
                                           "{}, gradient scale {}{}", options_.participant, step, assumed_.lr, d.lr,
                                           d.grad_scale, d.skip ? ", skipped" : ""));
    return true;
  }
  if (same) {
    if (auto s = swap_->commit_shadow(); !s)
      throw std::runtime_error(fmt::format("ZeRO update of stage {}: {}", options_.participant, s.err().message));
    return true;
  }
  if (auto s = swap_->discard_shadow(); !s)
    throw std::runtime_error(fmt::format("rolling back stage {}'s streamed update: {}", options_.participant,
                                         s.err().message));
  optim::partition_state undo;
  undo.step = stream_undo_.step;
  part_->restore_state(undo); // the step count only: the state never left its files
  part_->set_betas(stream_undo_.beta1, stream_undo_.beta2);
  ++stream_redone_;
  return false;
}

} // namespace dsa::train
