// What a run's settings imply, asked by several rooms (run_config's queries).
#include "actors/train/config/run_config.hpp"

namespace dsa::train {

bool run_config::zero_partitions() const {
  return zero_stage >= 1 && (batch.data_parallel_size > 1 || (zero_stage == 3 && offload.param.swaps()));
}

bool run_config::gradients_partitioned() const {
  return zero_partitions() && (zero_stage >= 3 || (zero_stage == 2 && stages == 1));
}

bool run_config::streams_host_update() const {
  const bool adam = optimizer.type == optim::optimizer_type::adam || optimizer.type == optim::optimizer_type::adamw;
  return ((backend == "cuda" && offload.device == offload_device::cpu) || stream_host_update) && adam &&
         !zero_partitions() && offload.device != offload_device::nvme; // swapped: the NVMe stream's own
}

bool run_config::speculative_host_stream() const {
  return streams_host_update() && speculative_update && (gradient_clipping > 0 || working == precision::f16);
}

} // namespace dsa::train
