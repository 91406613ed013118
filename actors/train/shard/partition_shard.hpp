// The mode of a shard that holds a partition of its stage's flat layout
// (optim::partitioned_optimizer): ZeRO stages 1-3 over several ranks, and the state on
// NVMe (then partitioned even on one rank, so updates and checkpoints go chunk by chunk).
// It composes, as its options ask:
// - the NVMe store and its tracer (the swap's transfers as trace spans, swap_tracer.hpp);
// - the streamed update (update_stream.hpp);
// - ZeRO-3's fetcher, into whose store each new version is written;
// - 1-bit Adam, 0/1 Adam or 1-bit LAMB over the partition (partition_shard_onebit.cpp):
//   their exchanges and error buffers on an onebit_channel.
// Checkpoints take the per-rank form (partition_shard_checkpoint.cpp).
#pragma once

#include "actors/train/shard/onebit_channel.hpp"
#include "actors/train/shard/shard_base.hpp"
#include "actors/train/shard/swap_tracer.hpp"
#include "actors/train/shard/update_stream.hpp"
#include "optim/partitioned_optimizer.hpp"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dsa::aio {
class swap_store;
}

namespace dsa::train {

// Tensor `t` of a flat layout as a view of the flat buffer `flat`, in its own shape.
tensor layout_view(const tensor& flat, const optim::flat_tensor& t);

class partition_shard final : public shard_base {
public:
  explicit partition_shard(shard_options options);

  void init(const std::vector<tensor>& initial) override;
  std::vector<tensor> gradient_buffers() override;
  std::vector<actors::gradient_part> gradient_parts() override;

  // Streaming: with the state swapped to NVMe, Adam/AdamW, no loss scaling, no tied
  // gradient exchanged, gradients the stage does not sum itself, and not ZeRO-3.
  std::int64_t stream_elements() const override;
  void gradients_final(std::uint32_t step, std::uint32_t first) override;
  bool stream_update(std::uint32_t step) override;
  void cancel() override;
  void trace_attach(actors::trace_recorder* trace, std::uint32_t actor, std::int32_t stage) override;
  void trace_detach() override;

  const compressed_traffic* traffic() const override { return zchannel_ ? &zchannel_->traffic() : nullptr; }
  state_payload payload() const override;
  bool per_rank_checkpoint() const override { return true; }
  state_payload gathered_masters() const override;
  bool streams_masters() const override { return swap_ && options_.zero_ranks == 1 && options_.stream_masters; }
  ckpt::checkpoint_file stage_masters(const std::string& root, std::uint64_t step) const override;
  std::vector<ckpt::checkpoint_file> stage_partition(const std::string& root, std::uint64_t step) const override;
  bool saves_errors() const override { return zchannel_ && options_.peers && options_.peers->size() > 1; }
  std::vector<ckpt::checkpoint_file> stage_errors(const std::string& root, std::uint64_t step) const override;
  status flush_state() override { return part_ ? part_->flush() : status{}; }
  std::string swap_report() const override;
  shard_bytes held_bytes() const override;

private:
  bool local_next() const override { return zlocal_next_.load(std::memory_order_acquire); }
  actors::grad_totals local_totals(const actors::grad_totals& totals) override {
    return zchannel_->local_totals(totals);
  }
  void advance(std::uint32_t step, const step_decision& d) override;
  void publish(const step_decision& d, std::vector<tensor>& out) override;
  bool can_speculate() const override { return !zchannel_; } // 1-bit exchanges cannot be taken back
  void back_up() override;
  void roll_back() override;
  void keep_speculated() override;
  bool settle_streamed(std::uint32_t step, const step_decision& would, const step_decision& d) override {
    return stream_.settle(step, would, d);
  }

  expected<optim::partitioned_optimizer> create(const optim::flat_layout& layout, const std::vector<tensor>& initial);
  // The partition's update (or, skipped, its working weights from the masters) into
  // `working`: the given tensor, flat_working_ (undefined and no sink), or the sink.
  status advance_partition(const step_decision& d, tensor working, const optim::working_sink& sink = {});
  // ZeRO-3: the new version into the fetcher's store, in place or window by window.
  status advance_into_fetcher(const step_decision& d);
  std::int64_t version_window() const;
  // This rank's partition of the reduced gradients (ZeRO-2 copies the owned piece of the
  // whole tied gradient in first).
  tensor partition_grad();
  // The whole flat buffer from every rank's partition (a copy with one rank).
  void gather_flat(const tensor& all, const tensor& mine, const char* what) const;
  // Element-wise sums of `partial` over the ranks (LAMB's norm exchanges).
  expected<std::vector<double>> sum_over_ranks(const std::vector<double>& partial) const;

  // The 1-bit part (partition_shard_onebit.cpp).
  void init_onebit();
  status advance_onebit(const step_decision& d, const tensor& working);
  std::unique_ptr<onebit_channel> zchannel_;
  std::atomic<bool> zlocal_next_{false};
  // 0/1 Adam's local steps: flat_working_ holds this rank's own whole weights already
  // (publish gathers nothing).
  bool working_whole_ = false;

  std::optional<optim::partitioned_optimizer> part_;
  aio::swap_store* swap_ = nullptr;          // NVMe offload: part_'s store
  std::shared_ptr<swap_tracer> swap_tracer_; // NVMe offload: the store's observer (shared with it)
  // (padded_numel) f32, or (partition_numel) with ZeRO stage 2: the reducer's gradient
  // buffers are views of it (but for whole_grad_).
  tensor flat_grad_;
  tensor whole_grad_; // ZeRO stage 2: options_.whole_gradient's whole f32 gradient, or undefined
  // (padded_numel) working dtype: the all-gathered weights the params slot views; with
  // ZeRO-3 (partition_numel): this rank's partition, which the params slot holds alone.
  tensor flat_working_;

  // Speculation's copies of what a step changes (allocated on the first speculation).
  struct backup {
    optim::partition_state part; // copies (only the step count with the state swapped), and the step count
    tensor grad;                 // partition_grad()
    double beta1 = 0, beta2 = 0;
  } backup_;

  update_stream stream_;
  optim::chunk_ready stream_ready_; // set during stream_update only
};

} // namespace dsa::train
