// 1-bit Adam, 0/1 Adam and 1-bit LAMB over a ZeRO partition (stage 1 or 2, the state in
// memory): the partition's step_onebit, its exchanges and error buffers on an
// onebit_channel. See partition_shard.hpp.
#include "actors/train/shard/partition_shard.hpp"

#include "actors/data_parallel.hpp"
#include "actors/train/shard/shard_checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace dsa::train {

void partition_shard::init_onebit() {
  const auto type = options_.optimizer.type;
  DSA_CHECK(!options_.partition_gradients && !options_.partition_parameters && !options_.offload,
            "optimizer shard {}: {} over a ZeRO partition needs whole gradients and the state in memory",
            options_.participant, optim::optimizer_name(type));
  zchannel_ = std::make_unique<onebit_channel>(options_.peers, options_.logger, shard_name());
  const auto& specs = options_.specs;
  for (std::size_t i = 0; i < specs.size(); ++i)
    if (specs[i].name == bert::position_embeddings_name() && options_.mask_positions_from >= 0 &&
        specs[i].shape.size() == 2)
      part_->mask_momentum(i, options_.mask_positions_from * specs[i].shape[1]);
  if (!options_.resume_errors.empty()) {
    std::map<std::string, std::int64_t> numel;
    for (const auto& [name, n] : part_->onebit_groups()) numel[name] = n;
    if (auto loaded = zchannel_->load_errors(options_.resume_errors, numel); !loaded)
      throw std::runtime_error(fmt::format("checkpoint group {}: {}",
                                           checkpoint_errors_group(options_.participant, options_.zero_rank),
                                           loaded.err().message));
  }
  if (type == optim::optimizer_type::onebit_lamb && part_->step_count() > 0) {
    // 1-bit LAMB's coefficients, factors, scalings and fresh variance: the checkpoint's
    // replicated group (lamb_state_group), which a stage-0 checkpoint does not have.
    const std::string group = checkpoint_lamb_group(options_.participant);
    if (options_.resume_lamb.empty())
      throw std::runtime_error(fmt::format("checkpoint has no group {} with 1-bit LAMB's state beyond the partitions",
                                           group));
    if (auto loaded = part_->load_lamb_state(options_.resume_lamb); !loaded)
      throw std::runtime_error(fmt::format("checkpoint group {}: {}", group, loaded.err().message));
    options_.resume_lamb.clear(); // loaded: the fresh variance is not kept twice
  }
  zlocal_next_.store(part_->compressed_next() && options_.zero_ranks > 1, std::memory_order_release);
}

// A compressed optimizer's step over the partition: on the partition of the averaged
// gradients while they are averaged, else on this rank's whole gradients (their own mean),
// exchanging the momentum (1-bit Adam and LAMB), the gradients or the accumulated moves (0/1 Adam).
status partition_shard::advance_onebit(const step_decision& d, const tensor& working) {
  const bool local = zlocal_next_.load(std::memory_order_acquire);
  optim::onebit_partition_step in;
  in.grad = local ? flat_grad_ : partition_grad();
  in.grad_scale = local ? d.grad_scale * options_.zero_ranks : d.grad_scale;
  in.working = working;
  in.whole_working = flat_working_;
  in.exchange = [this](const std::string& group, float* values, std::int64_t count, bool reset_errors) {
    return zchannel_->exchange(group, values, count, reset_errors);
  };
  in.gather = [this](float* whole, const float* mine) -> status {
    const std::int64_t n = part_->layout().padded_numel();
    return actors::log_collective(options_.logger, "all_gather", n * 4, shard_name(), [&] {
      return options_.peers->allgather(whole, mine, dtype::f32, n);
    });
  };
  // 1-bit LAMB: block sums added and largest ratios taken over the ranks, through an
  // allgather (every rank combines the same values in rank order).
  in.sum = [this](std::vector<double>& values) -> status {
    DSA_ASSIGN_OR_RETURN(const std::vector<double> total, sum_over_ranks(values));
    std::copy(total.begin(), total.end(), values.begin()); // in place: the caller holds pointers into it
    return {};
  };
  in.max = [this](std::vector<float>& values) -> status {
    const std::size_t ranks = static_cast<std::size_t>(options_.peers->size()), n = values.size();
    std::vector<float> all(n * ranks);
    DSA_TRY(actors::log_collective(options_.logger, "all_gather", static_cast<std::int64_t>(all.size()) * 4,
                                   shard_name(), [&] {
                                     return options_.peers->allgather(all.data(), values.data(), dtype::f32,
                                                                      static_cast<std::int64_t>(all.size()));
                                   }));
    for (std::size_t i = 0; i < n; ++i) {
      values[i] = all[i];
      for (std::size_t r = 1; r < ranks; ++r) values[i] = std::max(values[i], all[r * n + i]);
    }
    return {};
  };
  DSA_TRY(part_->step_onebit(in));
  working_whole_ = part_->local_params(); // 0/1 Adam's local steps: nothing to gather
  std::int64_t elements = 0;
  for (const auto& t : part_->layout().tensors()) elements += t.numel;
  zchannel_->count_step(elements, local);
  zlocal_next_.store(part_->compressed_next() && options_.zero_ranks > 1, std::memory_order_release);
  return {};
}

} // namespace dsa::train
