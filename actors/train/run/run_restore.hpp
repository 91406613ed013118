// Resuming one rank from checkpoint.load (prepare_rank, run_setup.cpp).
#pragma once

#include "actors/train/run/run_context.hpp"
#include "actors/train/run/run_setup.hpp"

#include <string>

namespace dsa::train {

// Whether the shards hold partitions of their stages' optimizer state (ZeRO over several
// ranks, or the state swapped to NVMe; make_shard picks partition_shard then).
bool partitioned(const run_config& rc);

// Restores checkpoint `which` into m's stages and returns what the shards and the data
// need; sets in.first_step and seeks m.provider. A partitioned run loads only the model
// file whole (every rank holds its stages' working weights): its shards read their own
// ranges of the optimizer files and masters later.
expected<restored> restore(run_inputs& in, rank_model& m, const std::string& which);

} // namespace dsa::train
