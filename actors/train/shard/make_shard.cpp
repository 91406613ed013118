// The one place a shard's mode is chosen; see shard_options.hpp.
#include "actors/train/shard/partition_shard.hpp"
#include "actors/train/shard/shard_options.hpp"
#include "actors/train/shard/whole_shard.hpp"

namespace dsa::train {

std::unique_ptr<model_shard> make_shard(shard_options options) {
  // ZeRO over several ranks, the state on NVMe (partitioned even on one rank, so it moves
  // chunk by chunk) or ZeRO-3's parameter partitions.
  if (options.zero_ranks > 1 || options.offload || options.partition_parameters)
    return std::make_unique<partition_shard>(std::move(options));
  if (options.optimizer.compressed()) return std::make_unique<compressed_whole_shard>(std::move(options));
  return std::make_unique<whole_shard>(std::move(options));
}

} // namespace dsa::train
