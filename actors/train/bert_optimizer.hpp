// An optimizer shard for one pipeline stage behind the runtime's
// optimizer_compute interface: fp32 master weights and Adam/AdamW/LAMB state
// of that stage's parameters. Per step it converts the incoming (possibly half)
// gradients, takes part in the step rendezvous (tied embedding sum, global norm,
// overflow), unscales and clips, steps, and sends the new working weights.
#pragma once

#include "actors/compute.hpp"
#include "actors/train/precision.hpp"
#include "actors/train/step_sync.hpp"
#include "models/bert/parameter_specs.hpp"
#include "optim/optimizer.hpp"

#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dsa::train {

// global: every shard meets the others at each step (global gradient norm for
// clipping, fp16 overflow OR-ed over stages) and the update waits for the whole
// backward. local: no step decision needs other stages (no clipping, no loss
// scaling), so each shard updates as soon as its own gradients are complete,
// overlapping the other stages' backward; only the tied-embedding holders meet.
enum class decision_scope : std::uint8_t { global, local };

struct bert_optimizer_options {
  std::uint32_t participant = 0;          // the stage index
  std::vector<bert::param_spec> specs;    // the stage's parameters, in its order
  optim::optimizer_config optimizer;
  precision working = precision::f32;
  decision_scope scope = decision_scope::global;
  std::uint32_t tied_holders = 1; // shards holding the tied word embedding (2 with several stages)
  // global: called once per step, on the last shard to arrive, under the rendezvous lock.
  std::function<step_decision(std::uint32_t step, const std::vector<step_contribution>&)> decide;
  // local: called by this shard alone, with its own contribution.
  std::function<step_decision(std::uint32_t step, const step_contribution&)> decide_local;
  // Called once per step on the last shard to finish the update, with every shard's payload
  // ("master.<name>", "<name>.exp_avg", "<name>.exp_avg_sq", "optimizer_step_count";
  // empty unless the decision says save_state).
  // The last argument is the step's global sum of squares of the (scaled) gradients.
  std::function<void(std::uint32_t step, const step_decision&, std::vector<step_sync::payload>&, double)> after_step;
  // Resuming: fp32 masters by name and optimizer state, used instead of the stage's weights.
  std::map<std::string, tensor> resume_masters;
  std::optional<optim::optimizer_state> resume_state;
  std::int64_t fail_step = -1; // testing: update of this step throws
  std::atomic<std::int64_t>* update_ns = nullptr; // wall_clock_breakdown: time in update(), summed
};

class bert_optimizer final : public actors::optimizer_compute {
public:
  bert_optimizer(bert_optimizer_options options, step_sync& sync);

  void init(const std::vector<tensor>& initial) override;
  void update(std::uint32_t step, const std::vector<tensor>& grads, std::vector<tensor>& out) override;

  const optim::optimizer& inner() const { return *opt_; }
  // Copies of the master weights ("master.<name>") and optimizer state, for checkpoints.
  step_sync::payload state_payload() const;

private:
  void write_working(std::vector<tensor>& out) const;

  bert_optimizer_options options_;
  step_sync& sync_;
  std::vector<optim::param_slot> slots_; // in stage order (views shared with the groups)
  std::optional<optim::optimizer> opt_;
  int tied_index_ = -1;
};

} // namespace dsa::train
