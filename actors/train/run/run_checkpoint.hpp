// What a training checkpoint holds and how a run is restored from it.
// Groups: "model" (fp32 master weights, HuggingFace names, the tied word
// embedding once: loadable by HuggingFace as is) and "optimizer_<stage>"
// (exp_avg / exp_avg_sq per parameter, optimizer_step_count). The manifest
// state holds the next step, the schedule's iteration, the loss scaler, the
// data cursor, skipped steps, the layout and the effective config.
#pragma once

#include "actors/train/shard/model_shard.hpp"
#include "io/ckpt/checkpoint_dir.hpp"
#include "optim/loss_scaler.hpp"
#include "optim/optimizer.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::train {

struct run_progress_state {
  std::uint64_t next_step = 0;
  std::int64_t schedule_iteration = -1; // lr_schedule::last_batch_iteration
  optim::loss_scaler_state scaler;
  std::vector<std::uint64_t> data_cursor;
  std::int64_t skipped_steps = 0;
  std::uint32_t stages = 1;
  std::string layout;    // the stages' layer ranges, e.g. "embeddings + layers [0, 2) | layers [2, 4) + head"
  std::string precision; // fp32, fp16 or bf16
  std::int64_t micro_batch_size = 0, gradient_accumulation = 0;
  std::int64_t data_parallel_size = 1; // absent in checkpoints of single-rank versions: 1
  std::string config_toml;
};

nlohmann::json progress_to_json(const run_progress_state& s);
expected<run_progress_state> progress_from_json(const nlohmann::json& j, const std::string& where);

// Builds the checkpoint groups from every shard's payload (see model_shard.hpp).
ckpt::tensor_groups checkpoint_groups(std::vector<state_payload>& payloads);

// The whole optimizer state of shard `stage`: its group optimizer_<stage> when `ck` loaded
// one, else assembled from the stage's per-rank ZeRO files, read by range from ck.dir
// (open_stage_sources), one tensor at a time.
expected<optim::optimizer_state> optimizer_state_of(const ckpt::loaded_checkpoint& ck, std::uint32_t stage);

// The model weights of a checkpoint in any form `init_checkpoint` accepts: a
// safetensors file, a checkpoint directory (step_N) or a checkpoint root (its latest);
// the last two hold them in model.safetensors.
expected<std::string> weights_file_of(const std::string& path);

// `dsactor convert zero-to-fp32 CKPT OUT`: the checkpoint's whole model as one
// HuggingFace-named safetensors file of fp32 tensors, written atomically. Every rank's
// partition is already gathered into the checkpoint's model file (ZeRO stage 1 gathers
// at save), so this reads that one file (one copy in memory), widens any half tensor to
// fp32, leaves out integer buffers, and writes OUT.
struct converted {
  std::size_t tensors = 0;
  std::int64_t parameters = 0;
  std::string source;
  std::vector<std::string> skipped; // non-float tensors left out (e.g. position_ids)
};
expected<converted> convert_to_fp32(const std::string& checkpoint, const std::string& out);

} // namespace dsa::train
