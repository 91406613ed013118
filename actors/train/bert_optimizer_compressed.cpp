// A shard running a compressed optimizer (1-bit Adam, 0/1 Adam, 1-bit LAMB); see
// bert_optimizer.hpp and compressed_shard.hpp.
#include "actors/train/bert_optimizer.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dsa::train {

void bert_optimizer::init_compressed(const std::vector<tensor>& initial) {
  const auto& specs = options_.specs;
  std::vector<tensor> start = initial;
  if (!options_.resume_masters.empty())
    for (std::size_t i = 0; i < specs.size(); ++i) {
      auto resumed = options_.resume_masters.find(specs[i].name);
      if (resumed == options_.resume_masters.end())
        throw std::runtime_error("checkpoint has no master weights for " + specs[i].name);
      start[i] = resumed->second;
    }
  compressed_shard_options o;
  o.optimizer = options_.optimizer;
  o.specs = specs;
  o.peers = options_.peers;
  o.logger = options_.logger;
  o.caller = shard_name();
  o.mask_positions_from = options_.mask_positions_from;
  comp_ = std::make_unique<compressed_shard>(std::move(o), start);
  if (options_.resume_state)
    if (auto loaded = comp_->load_state(options_.resume_state->tensors, options_.resume_state->step); !loaded)
      throw std::runtime_error(loaded.err().message);
  if (!options_.resume_errors.empty())
    if (auto loaded = comp_->load_errors(options_.resume_errors); !loaded)
      throw std::runtime_error(fmt::format("checkpoint group {}: {}",
                                           checkpoint_errors_group(options_.participant,
                                                                   static_cast<std::uint32_t>(options_.peers->rank())),
                                           loaded.err().message));
  const dtype half = working_dtype(options_.working);
  slots_.clear();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    optim::param_slot s;
    s.name = specs[i].name;
    s.param = comp_->params()[i];
    s.grad = comp_->grads()[i];
    if (half != dtype::f32) s.half_copy = cast_to(s.param, half);
    slots_.push_back(s);
  }
}

} // namespace dsa::train
