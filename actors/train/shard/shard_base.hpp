// What every mode of optimizer shard shares (make_shard picks the mode): the update's
// flow (the decision, a speculated step kept or rolled back, the step on the masters and
// moments, the new version with the next loss scale), the speculation part, and the
// defaults of a shard that checkpoints whole. A mode (whole_shard.hpp, partition_shard.hpp)
// supplies its state: how it steps, publishes a version, backs up and rolls back, and
// checkpoints.
#pragma once

#include "actors/train/shard/model_shard.hpp"
#include "actors/train/shard/shard_options.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dsa::train {

// Speculation (optimizer_compute::speculate), a part every mode composes: the step
// speculated on (its update not yet run) and the decision assumed for it; update() keeps
// the speculated step when the decision is the assumed one, else the mode rolls it back.
class speculation {
public:
  void begin(std::uint32_t step, const step_decision& assumed);
  bool pending() const { return step_.has_value(); }
  // The update of `step` comes: whether it was speculated on, and whether the speculated
  // step stands under decision `d` (then it is counted as kept, else as rolled back).
  struct outcome {
    bool speculated = false, kept = false;
  };
  outcome settle(std::uint32_t participant, std::uint32_t step, const step_decision& d);
  std::int64_t speculated() const { return speculated_; }
  std::int64_t rolled_back() const { return rolled_back_; }

private:
  std::optional<std::uint32_t> step_;
  step_decision assumed_;
  std::int64_t speculated_ = 0, rolled_back_ = 0;
};

// Speculation's back-ups: dst = a copy of src (undefined for an undefined src), reusing
// dst's storage when it fits.
void keep_copy(tensor& dst, const tensor& src);

class shard_base : public model_shard {
public:
  explicit shard_base(shard_options options);

  // False on the steps a compressed optimizer keeps its gradients local.
  bool sums_gradients() const final { return !local_next(); }
  bool update(std::uint32_t step, const actors::grad_totals& totals, std::vector<tensor>& out) final;
  // Steps assuming no clipping and no overflow (step_decider::assume) after the mode backs
  // up what the step changes (masters, moments, gradients, step count); update() keeps it
  // when the decision is the assumed one, else rolls back and redoes the step (or skips).
  // False where the mode's exchanges cannot be taken back (compressed optimizers).
  bool speculate(std::uint32_t step) final;

  const step_decider& decider() const final { return *options_.decider; }
  const step_decision& last_decision() const final { return last_; }
  // Speculations of both kinds: speculate()'s, and a mode's own (a host stream started
  // before the totals under clipping or loss scaling: whole_shard).
  std::int64_t speculated() const final { return speculation_.speculated() + streamed_speculations(); }
  std::int64_t rolled_back() const final { return speculation_.rolled_back() + streamed_rollbacks(); }

  // A shard that checkpoints whole (payload) has none of the per-rank form.
  bool per_rank_checkpoint() const override { return false; }
  state_payload gathered_masters() const override;
  bool streams_masters() const override { return false; }
  ckpt::checkpoint_file stage_masters(const std::string& root, std::uint64_t step) const override;
  std::vector<ckpt::checkpoint_file> stage_partition(const std::string& root, std::uint64_t step) const override;
  bool saves_errors() const override { return false; }
  std::vector<ckpt::checkpoint_file> stage_errors(const std::string& root, std::uint64_t step) const override;
  status flush_state() override { return {}; }
  const compressed_traffic* traffic() const override { return nullptr; }
  std::string swap_report() const override { return {}; }

protected:
  // What a mode supplies. Whether the next step's gradients stay on each rank (a
  // compressed optimizer's local step), and a local step's totals as the decider sees them.
  virtual bool local_next() const { return false; }
  virtual actors::grad_totals local_totals(const actors::grad_totals& totals) { return totals; }
  // The step on the masters and moments under decision `d` (or what a skipped step does).
  virtual void advance(std::uint32_t step, const step_decision& d) = 0;
  // The new version's tensors into `out` (update() appends the loss scale).
  virtual void publish(const step_decision& d, std::vector<tensor>& out) = 0;
  // Speculation: whether the mode can take a step back, and how.
  virtual bool can_speculate() const = 0;
  virtual void back_up() = 0;
  virtual void roll_back() = 0;
  virtual void keep_speculated() {}
  // A mode's own speculative updates and how many of them it took back (none by default).
  virtual std::int64_t streamed_speculations() const { return 0; }
  virtual std::int64_t streamed_rollbacks() const { return 0; }
  // A mode that streams its update over the backward: whether the update of `step` was
  // streamed and stands under `d` (`would`: what a stream of the step assumed). Called by
  // every update, streamed or not.
  virtual bool settle_streamed(std::uint32_t step, const step_decision& would, const step_decision& d) {
    (void)step, (void)would, (void)d;
    return false;
  }

  bool speculation_pending() const { return speculation_.pending(); }
  // A whole stage's starting masters: by name from resume_masters (when resuming), or else
  // the stage's weights.
  std::vector<tensor> starting_masters(const std::vector<tensor>& initial) const;
  // wall_clock_breakdown: the time from `since` to now added to the optimizer's.
  void add_update_time(std::chrono::steady_clock::time_point since) const;
  // "shard <stage> of rank <r>", as comms_logger's caller.
  std::string shard_name() const;

  shard_options options_;
  std::int64_t version_bytes_ = 0; // the last version's own tensors (held_bytes)

private:
  step_decision last_;
  speculation speculation_;
};

} // namespace dsa::train
