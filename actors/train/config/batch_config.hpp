// DeepSpeed's batch-size rule: any two of train_batch_size,
// train_micro_batch_size_per_gpu and gradient_accumulation_steps determine the
// third (with the data-parallel size), and all three must agree.
#pragma once

#include "core/config.hpp"
#include "core/error.hpp"

#include <cstdint>

namespace dsa::train {

struct batch_config {
  std::int64_t train_batch_size = 0;
  std::int64_t micro_batch_size = 0;       // train_micro_batch_size_per_gpu
  std::int64_t gradient_accumulation = 0;  // gradient_accumulation_steps (M micro-batches per step)
  std::int64_t data_parallel_size = 1;
};

// Resolves the three keys of `cfg` as DeepSpeed does, for `dp` data-parallel replicas,
// recording every problem in `problems`.
batch_config read_batch_config(const config& cfg, std::int64_t dp, config_problems& problems);
// As read_batch_config, with every problem in one error.
expected<batch_config> resolve_batch_config(const config& cfg, std::int64_t dp);

} // namespace dsa::train
