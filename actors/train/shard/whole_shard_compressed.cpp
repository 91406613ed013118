// A shard holding its whole stage under a compressed optimizer (1-bit Adam, 0/1 Adam,
// 1-bit LAMB); see whole_shard.hpp and compressed_shard.hpp.
#include "actors/train/shard/shard_checkpoint.hpp"
#include "actors/train/shard/whole_shard.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dsa::train {

void compressed_whole_shard::init(const std::vector<tensor>& initial) {
  const std::vector<tensor> start = starting_masters(initial);
  compressed_shard_options o;
  o.optimizer = options_.optimizer;
  o.specs = options_.specs;
  o.peers = options_.peers;
  o.logger = options_.logger;
  o.caller = shard_name();
  o.mask_positions_from = options_.mask_positions_from;
  comp_ = std::make_unique<compressed_shard>(std::move(o), start);
  // A 1-bit LAMB checkpoint of ZeRO ranks keeps its per-tensor state in one group
  // (checkpoint_lamb_group); the whole shard wants it per parameter group.
  if (options_.resume_state && !options_.resume_lamb.empty())
    lamb_state_per_group(options_.specs, options_.resume_lamb, options_.resume_state->tensors);
  if (options_.resume_state)
    if (auto loaded = comp_->load_state(options_.resume_state->tensors, options_.resume_state->step); !loaded)
      throw std::runtime_error(loaded.err().message);
  if (!options_.resume_errors.empty())
    if (auto loaded = comp_->load_errors(options_.resume_errors); !loaded)
      throw std::runtime_error(fmt::format("checkpoint group {}: {}",
                                           checkpoint_errors_group(options_.participant,
                                                                   static_cast<std::uint32_t>(options_.peers->rank())),
                                           loaded.err().message));
  set_slots(comp_->params(), comp_->grads());
}

void lamb_state_per_group(const std::vector<bert::param_spec>& specs, const std::map<std::string, tensor>& lamb,
                          std::map<std::string, tensor>& into) {
  // The stage-0 shard's one group: the decay group's tensors, then the others.
  std::vector<std::size_t> members;
  for (const bool no_decay : {false, true})
    for (std::size_t i = 0; i < specs.size(); ++i)
      if (optim::bert_no_decay(specs[i].name) == no_decay) members.push_back(i);
  if (members.empty()) return;
  for (const char* field : {"coeff", "factor", "scaling"}) {
    auto it = lamb.find(field);
    if (it == lamb.end() || it->second.type() != dtype::f32) continue; // load_state names what is missing
    const float* all = it->second.data<float>();
    std::vector<float> picked;
    if (it->second.numel() > 0)
      for (std::size_t i : members)
        if (static_cast<std::int64_t>(i) < it->second.numel()) picked.push_back(all[i]);
    into[fmt::format("compressed.{}.{}", optim::onebit_lamb_group, field)] = f32_tensor(picked);
  }
  std::vector<float> fresh;
  for (std::size_t i : members) {
    auto it = lamb.find(specs[i].name + ".exp_avg_sq_fresh");
    if (it == lamb.end()) break; // before the freeze: none
    fresh.insert(fresh.end(), it->second.data<float>(), it->second.data<float>() + it->second.numel());
  }
  into[fmt::format("compressed.{}.exp_avg_sq_fresh", optim::onebit_lamb_group)] = f32_tensor(fresh);
}

void compressed_whole_shard::advance(std::uint32_t, const step_decision& d) {
  if (d.skip) return;
  std::optional<std::pair<double, double>> betas;
  if (d.set_betas) betas = std::pair{d.beta1, d.beta2};
  if (auto s = comp_->step(d.lr, d.grad_scale, betas); !s)
    throw std::runtime_error(fmt::format("{} of stage {}: {}", optim::optimizer_name(options_.optimizer.type),
                                         options_.participant, s.err().message));
  refresh_halves();
}

state_payload compressed_whole_shard::payload() const {
  // Copies: the moments live in the optimizers' vectors.
  return slot_payload(comp_->state_tensors(), comp_->step_count());
}

shard_bytes compressed_whole_shard::held_bytes() const {
  shard_bytes b = slot_bytes();
  b.moments = 2 * b.masters;
  return b;
}

std::vector<ckpt::checkpoint_file> compressed_whole_shard::stage_errors(const std::string& root,
                                                                        std::uint64_t step) const {
  DSA_CHECK(saves_errors(), "optimizer shard {}: stage_errors without several ranks", options_.participant);
  return stage_error_files(options_, shard_name(), root, step, comp_->error_tensors(), {}, std::nullopt);
}

} // namespace dsa::train
