// The modes of a shard that holds its whole stage (ZeRO stage 0, no offload): one
// param_slot per parameter (the fp32 master, its f32 gradient the reducer fills, and the
// working half copy with bf16/fp16), stepped by optim::optimizer (whole_shard: Adam,
// AdamW, LAMB and the others) or by the compressed optimizers' flat groups
// (compressed_whole_shard: 1-bit Adam, 0/1 Adam, 1-bit LAMB). Both checkpoint whole
// (payload: views of the masters, and the moments).
#pragma once

#include "actors/train/shard/compressed_shard.hpp"
#include "actors/train/shard/host_stream.hpp"
#include "actors/train/shard/shard_base.hpp"
#include "optim/optimizer.hpp"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dsa::train {

// What the two whole modes share: the slots, the version written from them, their bytes.
class slot_shard : public shard_base {
public:
  using shard_base::shard_base;
  std::vector<tensor> gradient_buffers() override;

protected:
  // The slots over these masters and gradients (the half copy cast from the masters).
  void set_slots(const std::vector<tensor>& masters, const std::vector<tensor>& grads);
  // Each slot's working tensor (the half copy, or the master) copied into `out`.
  void publish(const step_decision& d, std::vector<tensor>& out) override;
  // The half copies cast again from the masters after a step.
  void refresh_halves();
  // The masters ("master.<name>", views) and the optimizer state's tensors and step count.
  state_payload slot_payload(std::map<std::string, tensor> state, std::int64_t step) const;
  // The slots' gradients, masters and half copies.
  shard_bytes slot_bytes() const;

  std::vector<optim::param_slot> slots_; // in stage order (views shared with the optimizer's groups)
};

class whole_shard final : public slot_shard {
public:
  using slot_shard::slot_shard;
  void init(const std::vector<tensor>& initial) override;
  state_payload payload() const override;
  shard_bytes held_bytes() const override;
  // The update streamed over the backward (options.stream_bucket, host_stream.hpp): Adam or
  // AdamW on a stage whose gradients are final bucket by bucket (no tied exchange), whose
  // decision does not wait for the totals (no clipping, no loss scaling) or, with
  // options.speculative_stream, assumed: each parameter's master, half copy, gradient and
  // moments are copied just before its step, and restored when the decision differs (a
  // clip, an overflow), the step then redone after the backward; a step right after one
  // that differed waits for the totals instead of streaming.
  std::int64_t stream_elements() const override;
  void gradients_final(std::uint32_t step, std::uint32_t first) override;
  bool stream_update(std::uint32_t step) override;
  void cancel() override;
  std::string swap_report() const override;

private:
  void advance(std::uint32_t step, const step_decision& d) override;
  bool can_speculate() const override { return true; }
  void back_up() override;
  void roll_back() override;
  bool settle_streamed(std::uint32_t step, const step_decision& would, const step_decision& d) override;

  std::optional<optim::optimizer> opt_;
  std::unique_ptr<host_stream> stream_; // with stream_elements() > 0, from init on
  step_decision streamed_with_;         // the decision a streamed step assumed
  bool streamed_speculative_ = false;   // it kept copies to restore (backup_)
  bool last_differed_ = false;          // the last decision differed from the assumption
  std::int64_t redone_ = 0, declined_ = 0;
  std::int64_t speculative_streams_ = 0; // steps streamed with copies to restore
  std::int64_t streamed_speculations() const override { return speculative_streams_; }
  std::int64_t streamed_rollbacks() const override { return redone_; }
  // A speculative stream's copy of slot i (master, gradient, half copy, moments) into backup_.
  void back_up_slot(std::size_t i, const optim::optimizer_state& live);
  struct backup {
    std::vector<tensor> params, grads, halves; // per slot (halves undefined without)
    optim::optimizer_state moments;            // copies, and the step count
    double beta1 = 0, beta2 = 0;
  } backup_;
};

class compressed_whole_shard final : public slot_shard {
public:
  using slot_shard::slot_shard;
  void init(const std::vector<tensor>& initial) override;
  state_payload payload() const override;
  shard_bytes held_bytes() const override;
  // Before init (a run that failed first) there is none yet.
  const compressed_traffic* traffic() const override { return comp_ ? &comp_->traffic() : nullptr; }
  // Over several ranks every rank's 1-bit error buffers go into its own file.
  bool saves_errors() const override { return comp_ && options_.peers && options_.peers->size() > 1; }
  std::vector<ckpt::checkpoint_file> stage_errors(const std::string& root, std::uint64_t step) const override;

private:
  bool local_next() const override { return comp_ && comp_->local_next(); }
  actors::grad_totals local_totals(const actors::grad_totals& totals) override { return comp_->local_totals(totals); }
  void advance(std::uint32_t step, const step_decision& d) override;
  // Its exchanges cannot be taken back.
  bool can_speculate() const override { return false; }
  void back_up() override {}
  void roll_back() override {}

  std::unique_ptr<compressed_shard> comp_;
};

// Group checkpoint_lamb_group's per-tensor 1-bit LAMB state (a checkpoint of ZeRO ranks) as
// a whole shard's "compressed.<group>.<field>" entries (its one group, decay tensors first).
void lamb_state_per_group(const std::vector<bert::param_spec>& specs, const std::map<std::string, tensor>& lamb,
                          std::map<std::string, tensor>& into);

} // namespace dsa::train
