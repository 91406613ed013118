// Setting up one data-parallel rank of `dsactor run` (its data, stages, deciders,
// restored state and optimizer shards) and the end-of-run evaluation; run_training
// (trainer.cpp) calls these for every rank of the process.
#pragma once

#include "actors/nvme_engine_actor.hpp"
#include "actors/run.hpp"
#include "actors/train/shard/model_shard.hpp"
#include "actors/train/data/feed_source.hpp"
#include "actors/train/run/run_checkpoint.hpp"
#include "actors/train/run/run_context.hpp"
#include "actors/train/shard/step_decider.hpp"
#include "io/net/transport.hpp"
#include "models/tokenizer/bert_tokenizer.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dsa::train {

// Prepares data.prepare / data.prepare_qa when asked and loads data.vocab, where named:
// tokenizing SQuAD text and dynamic masking need it; pre-training from shards alone takes
// the vocabulary size from their metadata.
expected<std::optional<tok::vocab>> load_vocab(run_inputs& in);
// m.provider and m.seq_length: pre-training shards or SQuAD training features (the shards
// may settle in.rc.model.vocab_size).
status make_provider(run_inputs& in, rank_model& m);

// What a checkpoint restored into a rank's stages gives its shards and data.
// A partitioned run (ZeRO ranks or NVMe offload) keeps no whole state here: its shards
// read their partitions' ranges from the checkpoint's files (partition_resume.hpp).
struct restored {
  std::map<std::string, tensor> masters;                 // whole runs only
  std::vector<optim::optimizer_state> optimizer_states; // whole runs only, one per stage
  std::vector<std::map<std::string, tensor>> error_states; // compressed optimizers: this rank's, per stage (maybe empty)
  std::vector<std::map<std::string, tensor>> lamb_states;  // 1-bit LAMB over ZeRO: group onebit_lamb_<s> (maybe empty)
  std::string dir;                                       // the checkpoint directory
  ckpt::checkpoint_manifest manifest;
  run_progress_state progress;
  // Saved on another pipeline layout: each stage takes its parameters' state by name from
  // the saved stages that held them (progress.stages of them).
  bool repartitioned = false;
};

// What one rank starts from beyond its inputs and model: its step deciders and, with
// checkpoint.load, the state it restored.
struct rank_start {
  std::vector<std::unique_ptr<step_decider>> deciders;
  std::optional<restored> resumed;
};

// Builds the rank's stages and deciders and restores checkpoint.load into them (which sets
// in.first_step and seeks m.provider).
expected<rank_start> prepare_rank(run_inputs& in, rank_model& m);

// One rank's part of the run: its share of the data, its optimizer shards, and
// the runtime's view of its stages and shards.
struct rank_run {
  std::unique_ptr<swap_area> swap; // NVMe offload: before the shards, so it goes after them
  // ZeRO-3 with offload_param on NVMe under another nvme_path than the optimizer's (with the
  // same path the parameters share `swap`).
  std::unique_ptr<swap_area> param_swap;
  // With either: the rank's NVMe engine actor over their engines. Every swap read and write
  // is a message to it; the stores hold its ports, which keep it until the last store goes.
  std::shared_ptr<actors::nvme_engine_service> nvme;
  std::unique_ptr<feed_source> source;
  std::vector<std::unique_ptr<model_shard>> shards; // make_shard's, held by their interface
  actors::run_parts parts;
  std::int64_t last_contributed = -1; // ZeRO, ranks > 0: the last checkpoint step they gathered for
};

// transport: the rank's transport to the other ranks (null with one rank), for the
// shards' own communicators under ZeRO; comms: the comms_logger the rank's ZeRO
// collectives are timed into (may be null).
expected<rank_run> make_rank_run(const run_inputs& in, rank_model& m, rank_start& start, net::transport* transport,
                                 net::comms_logger* comms = nullptr);

// ZeRO, a rank that does not write checkpoints: its shards' part of rank 0's checkpoint
// after `step` under `root` (the same collectives, in stage order): the gathered master
// weights, and this rank's optimizer partition written into the staging folder.
void contribute_checkpoint(rank_run& run, const std::string& root, std::uint32_t step);


} // namespace dsa::train
