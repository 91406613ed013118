// The one place a shard's mode is chosen; see shard_options.hpp.
#include "actors/train/shard/device_shard.hpp"
#include "actors/train/shard/partition_shard.hpp"
#include "actors/train/shard/shard_options.hpp"
#include "actors/train/shard/whole_shard.hpp"

namespace dsa::train {

std::unique_ptr<model_shard> make_shard(shard_options options) {
  // The GPU-resident optimizer: a whole stage, Adam or AdamW (choose_device refuses the rest).
  if (options.device) return std::make_unique<device_shard>(std::move(options));
  // ZeRO over several ranks, the state on NVMe (partitioned even on one rank, so it moves
  // chunk by chunk) or ZeRO-3's parameter partitions.
  if (options.zero_ranks > 1 || options.offload || options.partition_parameters)
    return std::make_unique<partition_shard>(std::move(options));
  if (options.optimizer.compressed()) return std::make_unique<compressed_whole_shard>(std::move(options));
  return std::make_unique<whole_shard>(std::move(options));
}

std::shared_ptr<optimizer_device> optimizer_device_for(const device_choice& device, const run_config& rc) {
  if (rc.host_optimizer_device) return make_host_optimizer_device(working_dtype(rc.working));
  if (device.device != stage_device::cuda || rc.offload.device != offload_device::none) return nullptr;
#if DSA_HAVE_CUDA
  return make_cuda_optimizer_device(device.index, working_dtype(rc.working));
#else
  DSA_CHECK(false, "a CUDA rank in a build without CUDA code (choose_device refuses that)");
  return nullptr;
#endif
}

} // namespace dsa::train
