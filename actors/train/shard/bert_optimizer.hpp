// An optimizer shard for one pipeline stage behind the runtime's
// optimizer_compute interface: fp32 master weights and Adam/AdamW/LAMB state
// of that stage's parameters. Its reducer fills its f32 gradient buffers (the
// tied embedding already summed) and hands it the step's totals; the shard's
// own step_decider turns them into the step's decision (skip, unscale and
// clip, lr); then it steps and writes the new working weights.
#pragma once

#include "actors/compute.hpp"
#include "actors/train/shard/compressed_shard.hpp"
#include "actors/train/shard/model_shard.hpp"
#include "actors/train/stage/param_fetcher.hpp"
#include "actors/train/config/precision.hpp"
#include "actors/train/shard/step_decider.hpp"
#include "actors/train/shard/swap_tracer.hpp"
#include "models/bert/parameter_specs.hpp"
#include "io/aio/submitter.hpp"
#include "io/ckpt/checkpoint_dir.hpp"
#include "io/net/comms_logger.hpp"
#include "io/net/communicator.hpp"
#include "optim/optimizer.hpp"
#include "optim/partition_checkpoint.hpp"
#include "optim/partitioned_optimizer.hpp"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace dsa::train {

struct bert_optimizer_options {
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

class bert_optimizer final : public model_shard {
public:
  // ZeRO-3 with the weights on NVMe: elements per window of a version passed to the store.
  static constexpr std::int64_t version_window_elements = shard_version_window_elements;
  explicit bert_optimizer(bert_optimizer_options options);

  void init(const std::vector<tensor>& initial) override;
  std::vector<tensor> gradient_buffers() override;
  std::vector<actors::gradient_part> gradient_parts() override;
  // False on the steps a compressed optimizer keeps its gradients local.
  bool sums_gradients() const override { return !local_next(); }
  bool update(std::uint32_t step, const actors::grad_totals& totals, std::vector<tensor>& out) override;
  // Steps assuming no clipping and no overflow (step_decider::assume) after copying the
  // masters, moments, gradients and step count it changes; update() keeps it when the
  // decision is the assumed one, else restores the copies and redoes the step (or skips).
  // Not with the state swapped to NVMe (a backup would be a second swap): returns false.
  bool speculate(std::uint32_t step) override;
  // Streaming (optimizer_compute::stream_elements): with the state swapped to NVMe,
  // Adam/AdamW, no loss scaling, no tied gradient exchanged and gradients the stage does
  // not sum itself, the update sweeps the state last chunk first (the order backward
  // finishes the gradients), each chunk as soon as its gradients are final, so the swap's
  // reads and writes overlap the backward. With clipping the stream is speculative (the
  // swap's second files) and a step that clips is redone. Not with ZeRO-3. The bits are
  // those of the update after the backward (the same kernels on the same elements).
  // After cancel() the shard streams no more (one run per shard).
  std::int64_t stream_elements() const override;
  void gradients_final(std::uint32_t step, std::uint32_t first) override;
  bool stream_update(std::uint32_t step) override;
  void cancel() override;
  // Steps streamed so far, their chunks, and of those the chunks updated before the
  // step's last part came (while the backward still ran), for the end-of-run log.
  std::int64_t streamed() const { return streamed_; }
  std::int64_t streamed_chunks() const { return streamed_chunks_; }
  std::int64_t early_chunks() const { return early_chunks_; }
  std::int64_t stream_redone() const { return stream_redone_; }
  std::int64_t stream_declined() const { return stream_declined_; }
  // Steps speculated and rolled back so far, for the end-of-run log.
  std::int64_t speculated() const override { return speculated_; }
  std::int64_t rolled_back() const override { return rolled_back_; }
  // NVMe offload: the swap transfers become swap_read/swap_write spans of this shard
  // (swap_tracer.hpp); nothing without offload.
  void trace_attach(actors::trace_recorder* trace, std::uint32_t actor, std::int32_t stage) override;
  void trace_detach() override;

  // The compressed optimizer's traffic (null for the others).
  const compressed_traffic* traffic() const override {
    return comp_ ? &comp_->traffic() : zchannel_ ? &zchannel_->traffic() : nullptr;
  }
  const step_decider& decider() const override { return *options_.decider; }
  // The decision of the last update (read between steps, when the shard is idle).
  const step_decision& last_decision() const override { return last_; }
  // The master weights and optimizer state for a checkpoint of a shard that is not
  // partitioned, as views of the shard's own tensors (no copy): valid while no update
  // runs, which the coordinator guarantees while a step hook (the checkpoint save) runs.
  state_payload payload() const override;
  // Whether checkpoints take the per-rank form below instead: the shard is partitioned
  // (ZeRO over several ranks, or the state swapped to NVMe, then even on one rank, so a
  // checkpoint streams it chunk by chunk).
  bool per_rank_checkpoint() const override { return part_.has_value(); }
  // A checkpoint in per-rank form. Both are collectives with several ranks: every
  // rank's shard of the stage calls them, in this order, at the same point of the run.
  // The whole stage's fp32 masters ("master.<name>"), gathered from the partitions on rank
  // 0 (empty on the other ranks, which hold no more than a partition for it).
  state_payload gathered_masters() const override;
  // One rank, the whole model in this one stage, the state swapped to NVMe
  // (bert_optimizer_options::stream_masters): the model file is written by the shard,
  // tensor by tensor from the masters' swap file, never the masters whole (then
  // gathered_masters is empty). stage_masters writes it into ckpt::staging_dir(root, step).
  bool streams_masters() const override { return swap_ && options_.zero_ranks == 1 && options_.stream_masters; }
  ckpt::checkpoint_file stage_masters(const std::string& root, std::uint64_t step) const override;
  // This rank's partition of the moments (optim::partition_payload's ranged names, the
  // shapes and the step count; no masters: the model file holds them), written as one
  // group per store chunk (checkpoint_partition_group) into ckpt::staging_dir(root, step);
  // then every rank's file entries, all-gathered (so every file is written when this
  // returns): the stage's staged files in rank order.
  std::vector<ckpt::checkpoint_file> stage_partition(const std::string& root, std::uint64_t step) const override;
  // A compressed optimizer over several ranks: every rank's 1-bit error buffers go into its
  // own file, group checkpoint_errors_group(stage, rank), staged into
  // ckpt::staging_dir(root, step). A collective (every rank's shard of the stage calls it
  // at the same point); returns every rank's file entries, in rank order.
  bool saves_errors() const override { return (comp_ || zchannel_) && options_.peers && options_.peers->size() > 1; }
  std::vector<ckpt::checkpoint_file> stage_errors(const std::string& root, std::uint64_t step) const override;
  // After the last update: waits for the optimizer state's transfers still in flight (NVMe
  // offload's writes behind the update); their error, so a failed swap fails the run.
  status flush_state() override { return part_ ? part_->flush() : status{}; }
  // Where the masters and moments live, for the log: "memory" or "nvme: DIR".
  std::string state_location() const { return part_ ? part_->store().where() : "memory"; }
  // NVMe offload: what the swap moved and how the updates spent their time, for the
  // end-of-run log; empty without offload.
  std::string swap_report() const override;
  // What the shard holds: its gradient buffers, masters (and their half copies),
  // moments, and the last parameter version it wrote (0 before its first update).
  shard_bytes held_bytes() const override;

private:
  void write_working(std::vector<tensor>& out);
  // "shard <stage> of rank <r>", as comms_logger's caller.
  std::string shard_name() const { return fmt::format("shard {} of rank {}", options_.participant, options_.zero_rank); }
  // update() in two halves: the step on the masters and moments (or nothing on a skip),
  // then the new version into `out` (with several ranks, gathered from their partitions).
  void advance(std::uint32_t step, const step_decision& d);
  status advance_partition(const step_decision& d, tensor working, const optim::working_sink& sink = {});
  status advance_into_fetcher(const step_decision& d);
  std::int64_t version_window() const;
  void publish(const step_decision& d, std::vector<tensor>& out);
  void back_up();
  void roll_back();
  // The whole flat buffer from every rank's partition (a copy with one rank).
  void gather_flat(const tensor& all, const tensor& mine, const char* what) const;
  // Element-wise sums of `partial` over the ranks (LAMB's norm exchanges).
  expected<std::vector<double>> sum_over_ranks(const std::vector<double>& partial) const;
  // Every rank's `mine` (the same length on every rank), rank after rank; `mine` alone on one rank.
  std::vector<std::int64_t> gather_entries(const std::vector<std::int64_t>& mine, const char* what) const;

  bert_optimizer_options options_;
  std::vector<optim::param_slot> slots_; // in stage order (views shared with the groups)
  std::optional<optim::optimizer> opt_;
  std::unique_ptr<compressed_shard> comp_; // the compressed optimizers, instead of opt_
  void init_compressed(const std::vector<tensor>& initial);
  // 1-bit Adam over a ZeRO partition (stage 1 or 2): the partition's step_onebit, its
  // exchanges and error buffers on zchannel_; zlocal_next_ as comp_->local_next().
  std::unique_ptr<onebit_channel> zchannel_;
  std::atomic<bool> zlocal_next_{false};
  // 0/1 Adam's local steps over a partition: flat_working_ holds this rank's own whole
  // weights already (publish gathers nothing).
  bool working_whole_ = false;
  void init_onebit_partition();
  // Group checkpoint_lamb_group's per-tensor 1-bit LAMB state as the whole shard's
  // "compressed.<group>.<field>" entries.
  void lamb_state_per_group(const std::map<std::string, tensor>& lamb, std::map<std::string, tensor>& into) const;
  status advance_onebit_partition(const step_decision& d, const tensor& working);
  // Whether the next step's gradients stay on each rank (a compressed optimizer's local step).
  bool local_next() const {
    return comp_ ? comp_->local_next() : zlocal_next_.load(std::memory_order_acquire);
  }
  actors::grad_totals local_totals(const actors::grad_totals& totals) {
    return comp_ ? comp_->local_totals(totals) : zchannel_->local_totals(totals);
  }
  step_decision last_;
  std::int64_t version_bytes_ = 0; // the tensors write_working allocated
  // ZeRO stages 1 and 2.
  void init_partitioned(const std::vector<tensor>& initial);
  std::optional<optim::partitioned_optimizer> part_;
  aio::swap_store* swap_ = nullptr;           // NVMe offload: part_'s store
  std::shared_ptr<swap_tracer> swap_tracer_;  // NVMe offload: the store's observer (shared with it)
  // (padded_numel) f32, or (partition_numel) with ZeRO stage 2: the reducer's gradient
  // buffers are views of it (but for whole_grad_).
  tensor flat_grad_;
  tensor whole_grad_; // ZeRO stage 2: options_.whole_gradient's whole f32 gradient, or undefined
  tensor partition_grad();
  // (padded_numel) working dtype: the all-gathered weights the params slot views; with
  // ZeRO-3 (partition_numel): this rank's partition, which the params slot holds alone.
  tensor flat_working_;
  // Speculation: the step speculated on (its update not yet run), the decision assumed,
  // and what the step changes, as it was before (allocated on the first speculation).
  std::optional<std::uint32_t> speculated_step_;
  step_decision assumed_;
  struct backup {
    std::vector<tensor> params, grads, halves; // whole shard: per slot (halves undefined without)
    optim::optimizer_state moments;            // whole shard: copies, and the step count
    optim::partition_state part;               // partitioned: copies, and the step count
    tensor grad;                               // partitioned: partition_grad()
    double beta1 = 0, beta2 = 0;
  } backup_;
  std::int64_t speculated_ = 0, rolled_back_ = 0;
  // Streaming: which parts of which step are final (gradients_final, from the shard
  // actor's thread), the step streamed (its update() not yet run) and the hook the
  // partition's sweep waits in (set during stream_update only).
  struct stream_gate {
    std::mutex mu;
    bool open = false; // parts of `step` came
    std::uint32_t step = 0;
    std::int64_t ready_from = 0; // partition elements from here on are final
    bool all_final = false;      // the step's last part came, at all_final_at
    std::chrono::steady_clock::time_point all_final_at;
    bool cancelled = false;
  };
  std::unique_ptr<stream_gate> gate_ = std::make_unique<stream_gate>();
  std::optional<std::uint32_t> streamed_step_;
  optim::chunk_ready stream_ready_;
  expected<bool> chunk_final(std::uint32_t step, std::int64_t lo);
  std::int64_t streamed_ = 0, streamed_chunks_ = 0, early_chunks_ = 0;
  // With clipping: the stream writes the swap's second files; the step count and betas to
  // restore if it clipped, the streams redone, and those not started because the step
  // before clipped (last_differed_: the last decision was not the assumed one).
  bool stream_speculative_ = false, last_differed_ = false;
  struct {
    std::int64_t step = 0;
    double beta1 = 0, beta2 = 0;
  } stream_undo_;
  std::int64_t stream_redone_ = 0, stream_declined_ = 0;
  bool settle_stream(std::uint32_t step, const step_decision& d);
};

} // namespace dsa::train
