// What `dsactor run` needs of an optimizer shard beyond the runtime's optimizer_compute:
// its step decisions, its state for checkpoints (whole or per rank), the last swap writes,
// and the figures the run reports. The run holds its shards as model_shard only;
// make_shard (shard_options.hpp) is the one place a shard is constructed, in the mode its
// options ask for (shard_base.hpp and its modes, which run on the host for every stage).
#pragma once

#include "actors/compute.hpp"
#include "actors/train/shard/onebit_channel.hpp"
#include "actors/train/shard/step_decider.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "io/ckpt/checkpoint_dir.hpp"
#include "models/bert/parameter_specs.hpp"
#include "optim/flat_layout.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dsa::train {

// A shard's state for a checkpoint: "master.<name>", "<name>.exp_avg",
// "<name>.exp_avg_sq", "optimizer_step_count".
using state_payload = std::map<std::string, tensor>;

// The bytes a shard holds (memory_accounting.hpp).
struct shard_bytes {
  std::int64_t gradients = 0, masters = 0, half_masters = 0, moments = 0, version = 0;
  std::int64_t swap_buffers = 0; // NVMe offload: the buffers the masters and moments pass through
};

// A stage's parameters (in its order) laid out flat and split over `ranks`: the layout a
// shard's partition, ZeRO-3's fetcher and the gradient partitions share.
expected<optim::flat_layout> stage_flat_layout(const std::vector<bert::param_spec>& specs, std::uint32_t ranks);

// ZeRO-3 with the weights on NVMe: elements per window of a parameter version a shard
// passes to the store (the memory plan counts one window's scratch).
constexpr std::int64_t shard_version_window_elements = 1 << 20;

class model_shard : public actors::optimizer_compute {
public:
  // The decider of its steps, and the decision of the last update (read between steps).
  virtual const step_decider& decider() const = 0;
  virtual const step_decision& last_decision() const = 0;

  // Checkpoints. A whole shard's masters and optimizer state, as views valid while no
  // update runs (the coordinator guarantees it during a step hook).
  virtual state_payload payload() const = 0;
  // Whether checkpoints take the per-rank form instead (ZeRO over several ranks, or the
  // state swapped to NVMe). Then each call below is a collective: every rank's shard of
  // the stage calls them, in this order, at the same point of the run.
  virtual bool per_rank_checkpoint() const = 0;
  // The stage's fp32 masters gathered on rank 0 (empty elsewhere, and when streamed).
  virtual state_payload gathered_masters() const = 0;
  // The model file written by the shard itself, tensor by tensor from its swap file.
  virtual bool streams_masters() const = 0;
  virtual ckpt::checkpoint_file stage_masters(const std::string& root, std::uint64_t step) const = 0;
  // This rank's partition of the moments staged into ckpt::staging_dir(root, step); every
  // rank's file entries, in rank order.
  virtual std::vector<ckpt::checkpoint_file> stage_partition(const std::string& root, std::uint64_t step) const = 0;
  // A compressed optimizer over several ranks: each rank's 1-bit error buffers in a file.
  virtual bool saves_errors() const = 0;
  virtual std::vector<ckpt::checkpoint_file> stage_errors(const std::string& root, std::uint64_t step) const = 0;

  // After the last update: the optimizer state's transfers still in flight (NVMe
  // offload's writes), with their error.
  virtual status flush_state() = 0;

  // Figures for the end-of-run report: the compressed optimizer's traffic (null for the
  // others), updates speculated and rolled back, the swap's line or a streamed update in
  // host memory's (empty when neither),
  // and the bytes it holds.
  virtual const compressed_traffic* traffic() const = 0;
  virtual std::int64_t speculated() const = 0;
  virtual std::int64_t rolled_back() const = 0;
  virtual std::string swap_report() const = 0;
  virtual shard_bytes held_bytes() const = 0;
};

} // namespace dsa::train
