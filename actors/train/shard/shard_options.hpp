// What `dsactor run` gives one stage's optimizer shard (make_rank_run fills it), and
// make_shard, which builds the shard in the mode the options ask for. A shard holds the
// fp32 master weights and optimizer state of its stage's parameters behind the runtime's
// optimizer_compute: its reducer fills its f32 gradient buffers (the tied embedding
// already summed) and hands it the step's totals; the shard's own step_decider turns them
// into the step's decision (skip, unscale and clip, lr); then it steps and writes the new
// working weights.
#pragma once

#include "actors/train/shard/model_shard.hpp"
#include "actors/train/shard/optimizer_device.hpp"
#include "actors/train/config/run_config.hpp"
#include "actors/train/stage/device_choice.hpp"
#include "actors/train/stage/param_fetcher.hpp"
#include "actors/train/config/precision.hpp"
#include "actors/train/shard/step_decider.hpp"
#include "models/bert/parameter_specs.hpp"
#include "io/aio/submitter.hpp"
#include "io/net/comms_logger.hpp"
#include "io/net/communicator.hpp"
#include "optim/optimizer.hpp"
#include "optim/partition_checkpoint.hpp"

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dsa::train {

struct shard_options {
  std::uint32_t participant = 0;       // the stage index
  std::vector<bert::param_spec> specs; // the stage's parameters, in its order
  optim::optimizer_config optimizer;
  precision working = precision::f32;
  std::unique_ptr<step_decider> decider;
  // Resuming a whole shard: fp32 masters by name and optimizer state, used instead of the
  // stage's weights.
  std::map<std::string, tensor> resume_masters;
  std::optional<optim::optimizer_state> resume_state;
  // Resuming a partitioned shard (ZeRO ranks or offload): the saved state's sources
  // (train::open_stage_sources), from which init reads only its partition's ranges;
  // used instead of resume_masters and resume_state.
  std::function<expected<std::vector<optim::saved_partition>>()> resume_partitions;
  // ZeRO stage 1: with zero_ranks > 1 this shard is rank zero_rank of the stage's
  // zero_ranks shards and holds the fp32 masters and moments of its partition of the
  // stage's flat layout only (optim::partitioned_optimizer); `peers` (its own channel
  // to the other ranks' shards of the stage) all-gathers the updated weights and
  // carries LAMB's norm exchange. zero_ranks 1: the whole stage (ZeRO stage 0).
  std::uint32_t zero_rank = 0, zero_ranks = 1;
  std::shared_ptr<net::communicator> peers;
  net::comms_logger* logger = nullptr; // comms_logger: the shard's collectives (may be null)
  // zero_optimization.offload_optimizer.device = "nvme": the partition's masters and
  // moments live in swap files in `dir`, moved by `engine` one sub-group at a time
  // (io/aio/swap_store.hpp). The shard is then partitioned even on one rank.
  struct nvme_offload {
    std::shared_ptr<aio::submitter> engine;
    std::string dir;
    std::int64_t sub_group = 1'000'000'000;
    std::size_t buffer_count = 4;
    bool pipeline_read = false, pipeline_write = false;
  };
  std::optional<nvme_offload> offload;
  // ZeRO stage 2 (with zero_ranks > 1): the shard keeps the f32 gradients of its
  // partition only (gradient_parts()), not the whole stage's. whole_gradient: the
  // parameter (an index into specs) whose gradient the reducer exchanges with another
  // stage (the tied embedding), kept whole so the exchange can add it; -1 for none.
  bool partition_gradients = false;
  int whole_gradient = -1;
  // ZeRO-3, and ZeRO-2 on one pipeline stage: the stage's gradient partition
  // (partition_grads::partition()), used as the shard's reduced gradients instead of a
  // copy. The stage adds into it during the backward and zeroes it only when it loads
  // the next version, after the update; so the reducer has nothing to copy.
  tensor shared_gradients;
  // ZeRO stage 3: each parameter version is this rank's partition of the working weights
  // only (the stage's param_fetcher gathers what it needs), not the all-gathered whole.
  bool partition_parameters = false;
  // ZeRO-3: the stage's fetcher; each new version is written into its store during the
  // update (param_fetcher::begin_version), and the version sent to the stage carries no
  // weights. Null: the version is a partition tensor of the shard's own.
  std::shared_ptr<param_fetcher> fetcher;
  // A whole stage in host memory (whole_shard) whose update streams over the backward in
  // buckets of about this many elements, each parameter updated as soon as its gradient is
  // final (host_stream.hpp): a CUDA rank with offload_optimizer.device = "cpu", or
  // debug.stream_host_update. 0: the update waits for the whole backward.
  std::int64_t stream_bucket = 0;
  // With stream_bucket, also when the decision waits for the totals (clipping, loss
  // scaling): the stream assumes no clip and no overflow, keeping a copy of each parameter's
  // state as it steps, and takes the step back when the decision differs
  // (pipeline.speculative_update).
  bool speculative_stream = false;
  // The run has one stage (this one: the model file is this shard's masters alone), so a
  // swapped state on one rank can stream it (streams_masters).
  bool stream_masters = false;
  // The stage's reducer exchanges its tied gradient with another stage's (the word
  // embedding, first and last stage of several): its gradients are not final bucket by
  // bucket, so the update does not stream.
  bool exchanges_tied = false;
  // The compressed optimizers (optimizer.type OneBitAdam, ZeroOneAdam, OneBitLamb; ZeRO
  // stage 0 only): `peers` is the shard's channel for their exchanges, and
  // position-embedding rows from mask_positions_from on are masked (compressed_shard.hpp).
  std::int64_t mask_positions_from = -1;
  // This rank's 1-bit error buffers from the checkpoint it resumes (its own file; empty:
  // they start at zero).
  std::map<std::string, tensor> resume_errors;
  // 1-bit LAMB over a ZeRO partition: the checkpoint's group checkpoint_lamb_group(stage)
  // (partitioned_optimizer::lamb_state's form; empty for a fresh run).
  std::map<std::string, tensor> resume_lamb;
  // The GPU-resident optimizer (a CUDA rank without offload_optimizer): the masters and
  // moments live there (device_shard.hpp). Null: in host memory, as every other mode.
  std::shared_ptr<optimizer_device> device;
  std::int64_t fail_step = -1;                    // testing: update of this step throws
  std::atomic<std::int64_t>* update_ns = nullptr; // wall_clock_breakdown: time in update(), summed
};

// The checkpoint group of rank `rank`'s partition of stage `stage`'s optimizer state:
// "optimizer_<stage>_rank<rank>", or with the state in several swap chunks one group per
// chunk, "optimizer_<stage>_rank<rank>_part<part>".
std::string checkpoint_partition_group(std::uint32_t stage, std::uint32_t rank, std::int64_t part = 0,
                                       std::int64_t parts = 1);

// The checkpoint group of 1-bit LAMB's state beyond the partitions of stage `stage` (the same
// on every rank, written by rank 0): "onebit_lamb_<stage>".
std::string checkpoint_lamb_group(std::uint32_t stage);

// The checkpoint group of rank `rank`'s 1-bit error buffers of stage `stage`:
// "onebit_errors_<stage>_rank<rank>".
std::string checkpoint_errors_group(std::uint32_t stage, std::uint32_t rank);

// The shard for these options, in the mode they ask for (the one place a mode is chosen):
// a partition (ZeRO ranks, NVMe offload or ZeRO-3: partition_shard.hpp), a whole stage
// under a compressed optimizer (compressed_whole_shard), a whole stage under Adam, AdamW,
// LAMB or the others of optim::optimizer (whole_shard), or a whole stage whose masters and
// moments live on a device (device_shard: options.device, a CUDA rank without
// offload_optimizer). See shard_base.hpp for what every mode shares.
std::unique_ptr<model_shard> make_shard(shard_options options);

// Where a rank's shards keep their state: the GPU of a CUDA rank whose
// offload_optimizer.device is "none" (DeepSpeed's placement), the host optimizer_device
// with debug.host_optimizer_device, else null (host memory, the other modes).
std::shared_ptr<optimizer_device> optimizer_device_for(const device_choice& device, const run_config& rc);

} // namespace dsa::train
