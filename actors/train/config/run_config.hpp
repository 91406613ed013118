// Everything `dsactor run` reads from its config, as plain structs. Keys follow
// DeepSpeed (train_batch_size, optimizer, scheduler, fp16, bf16,
// gradient_clipping, steps_per_print, wall_clock_breakdown, ...) plus dsactor's
// own tables: model, pipeline, data, checkpoint. Unknown keys anywhere are
// errors naming the key, with the nearest known key suggested; every problem of a
// config is reported at once.
#pragma once

#include "io/net/comms_logger.hpp"
#include "actors/train/config/batch_config.hpp"
#include "actors/train/config/offload_config.hpp"
#include "actors/train/config/precision.hpp"
#include "core/config.hpp"
#include "models/bert/bert_config.hpp"
#include "optim/loss_scaler.hpp"
#include "optim/optimizer.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace dsa::train {

// [data.prepare]: make the data set from a corpus when it is absent (quick start).
struct prepare_settings {
  std::string corpus;            // a corpus directory (Brown or plain text)
  std::string out_dir;           // vocab.txt, train-*.safetensors and holdout-*.safetensors go here
  std::int64_t vocab_size = 8000;
  std::int64_t seq_length = 128;
  std::int64_t max_predictions = 20;
  std::int64_t dupe_factor = 5;
  double short_seq_prob = 0.1;
  double masked_lm_prob = 0.15;
  std::int64_t holdout_docs = 20; // documents kept out for evaluation
  std::int64_t instances_per_shard = 4096;
  std::uint64_t seed = 12345;
  double block_mb = 64; // the corpus is read, tokenized and made into shards this much at a time
};

// [data.prepare_qa]: generate an extractive QA set in SQuAD v1.1 format from a
// corpus when absent (the SQuAD quick start; real SQuAD files are read unchanged).
struct prepare_qa_settings {
  std::string corpus;
  std::string out_dir; // train.json and dev.json go here
  double dev_fraction = 0.1;
  std::int64_t max_questions = 0;
  std::uint64_t seed = 12345;
};

struct data_settings {
  std::string vocab;           // vocab.txt
  bool lower_case = true;
  // Pre-training.
  std::string train_shards;    // a directory of *.safetensors shards
  std::string eval_shards;     // held-out shards ("" = none)
  std::int64_t shuffle_buffer = 4096;
  bool dynamic_masking = false;
  std::int64_t eval_batches = 0; // 0 = the whole held-out set
  // SQuAD.
  std::string train_file, dev_file;
  std::int64_t max_seq_length = 384, doc_stride = 128, max_query_length = 64;
  std::int64_t n_best_size = 20, max_answer_length = 30;
  std::optional<prepare_settings> prepare;
  std::optional<prepare_qa_settings> prepare_qa;
};

struct checkpoint_settings {
  std::string dir;                 // default <run_dir>/checkpoints
  std::int64_t save_interval = 0;  // steps; 0 = only at the end
  std::int64_t keep_last = 0;      // 0 = keep all
  bool save_final = true;
  // Compressed optimizers: resume each rank's 1-bit error buffers from its own file (true),
  // or restart them at zero as DeepSpeed does (false).
  bool load_error_feedback = true;
  std::string load;                // "" (fresh), "latest", a step number or a checkpoint directory
};

struct run_config {
  std::string config_path;
  std::string run_dir;
  batch_config batch;
  bert::bert_config model;
  std::string init_checkpoint; // HuggingFace-style safetensors to start from
  optim::optimizer_config optimizer;
  bool has_scheduler = false;
  precision working = precision::f32;
  // bf16.cpu_gemm: the GEMMs run on bf16 operands through oneDNN (AMX / AVX512_BF16 CPUs,
  // kernels/cpu/gemm_bf16.hpp); needs bf16.enabled.
  bool bf16_cpu_gemm = false;
  optim::loss_scaler_params scaler;
  double gradient_clipping = 1.0;
  // [devices] ranks: data-parallel replicas in this process (threads sharing an
  // in-process transport); the batch rule counts them in data_parallel_size.
  std::int64_t ranks = 1;
  // [devices] backend: where the stages compute, "cpu" or "cuda" (choose_device), and
  // device: the CUDA device's index among the visible ones (CUDA_VISIBLE_DEVICES
  // respected); -1: the local rank under dsactor launch, else 0.
  std::string backend = "cpu";
  std::int64_t device = -1;
  // [devices] deterministic: CUDA ranks sum every gradient in a fixed order (no float
  // atomics, no split-K products), so a GPU run and its resume repeat bit for bit. CPU ranks
  // always do.
  bool deterministic = false;
  // activation_checkpointing.cpu_checkpointing: the layer checkpoints in host memory (CPU
  // ranks keep them there anyway; a CUDA rank refuses it: its checkpoints stay on the device).
  bool cpu_checkpointing = false;
  // [devices] shared_memory_allreduce: the gradient allreduce of ranks on one host goes
  // through memory they share (true, the default) or over the transport as between hosts
  // (false: then the transport counts every byte, as `dsactor bench compressed` needs).
  bool shared_memory_allreduce = true;
  int processes = 1; // the job's processes (WORLD_SIZE under dsactor launch)
  // zero_optimization.reduce_bucket_size: gradients are summed over the ranks in
  // buckets of at most this many elements.
  std::int64_t reduce_bucket_elements = 500'000'000;
  int zero_stage = 0;       // zero_optimization.stage: 0, 1 (optimizer state partitioned), 2 (gradients too), 3 (weights too)
  // Why zero_stage differs from the configured stage (logged by rank 0), or empty.
  std::string zero_note;
  // Whether the run partitions over its ranks (ZeRO stage >= 1 with several ranks), or runs
  // ZeRO-3 on one rank to put the weights on NVMe (offload_param.device = "nvme").
  bool zero_partitions() const;
  // ZeRO-3, and ZeRO-2 on one pipeline stage: each micro-batch's gradients are summed into
  // the ranks' partitions (partition_grads), so the stages keep no whole gradients.
  bool gradients_partitioned() const;
  // A whole stage's update in host memory streamed over the backward (whole_shard's
  // host_stream): a CUDA rank with offload_optimizer.device = "cpu", or
  // debug.stream_host_update, under Adam or AdamW without ZeRO partitions. With clipping or
  // loss scaling it streams only with speculative_update (speculative_host_stream()).
  bool streams_host_update() const;
  bool speculative_host_stream() const;
  // ZeRO stage 3's parameter fetcher (DeepSpeed's keys and defaults), in elements:
  // stage3_prefetch_bucket_size, stage3_param_persistence_threshold, stage3_max_live_parameters.
  std::int64_t stage3_prefetch = 50'000'000, stage3_persistence = 100'000, stage3_max_live = 1'000'000'000;
  // ZeRO-3 on a CUDA rank: how many parts' weights may be on the device at once (the part
  // computing and those copied ahead of it); not a key: the device plan chooses it within
  // what stage3_prefetch_bucket_size allows (0: not chosen, that limit).
  std::int64_t zero3_device_window = 0;
  bool overlap_comm = false;              // zero_optimization.overlap_comm (DeepSpeed's default for stages 0-2)
  offload_settings offload; // zero_optimization.offload_optimizer, sub_group_size, [aio]
  net::comms_logger_options comms_logger; // [comms_logger], DeepSpeed's keys
  std::uint32_t stages = 1;
  // pipeline.stages_per_process: under dsactor launch, consecutive stages one process
  // runs (default 1: a stage per process). A replica then spans pipe_processes =
  // stages / stages_per_process processes, laid out as DeepSpeed's pipe-data topology
  // (rank = pipe position x data-parallel degree + data rank); pipe_processes 1 keeps
  // every stage in each process (the processes are then data-parallel replicas only).
  std::uint32_t stages_per_process = 1;
  int pipe_processes = 1;
  bool stages_across_processes() const { return pipe_processes > 1; }
  std::string partition = "parameters";
  std::string schedule = "1f1b"; // or "gpipe", or "zb" (zero-bubble: the backward split into B and W)
  // pipeline.max_stashed: with "zb", micro-batches a stage may hold between a forward and
  // its W (default 0: the number of stages, 1F1B's activation memory: ZB-H1 in the
  // unit-cost model; 2 x stages - 1: ZB-H2). pipeline.max_deferred_w: of those, at most
  // this many whose B ran and W did not (default 0: the stash is the only bound).
  // schedule_policy::zero_bubble turns both into each stage's bounds.
  std::int64_t max_stashed = 0;
  std::int64_t max_deferred_w = 0;
  // pipeline.speculative_update: with clipping or fp16 and several stages, a shard
  // updates before the global norm is in and rolls back when it clips or overflows.
  // Off by default: the rollback copy costs as much memory as the shard's state.
  bool speculative_update = false;
  std::int64_t train_steps = 0;
  double epochs = 0.0;
  std::int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  std::uint64_t seed = 42;
  std::int64_t watchdog_seconds = 600;
  // [debug] fail_stage / fail_step: stage fail_stage throws in its forward of step
  // fail_step (testing the failure path of a real run); -1 = never.
  std::int64_t fail_stage = -1, fail_step = -1;
  // [debug] overflow_step: every stage hands the reducer an infinite gradient in step
  // overflow_step (fp16 only: the loss scaler skips the step and lowers the scale, on CPU
  // and CUDA ranks alike); -1 = never.
  std::int64_t overflow_step = -1;
  // [debug] host_optimizer_device: the shards keep their state as a CUDA rank's GPU-resident
  // optimizer does (device_shard), over the host optimizer_device, so a CPU run takes that
  // path end to end (tested against the plain run, bit for bit).
  bool host_optimizer_device = false;
  // [debug] stream_host_update: a whole stage's update in host memory streams over the
  // backward (whole_shard, host_stream.hpp) on CPU ranks too, as it does on a CUDA rank with
  // offload_optimizer.device = "cpu", so a CPU run takes that path (tested against the
  // plain run, bit for bit).
  bool stream_host_update = false;
  std::int64_t fail_optimizer_step = -1; // the shard of fail_stage throws in this step's update
  checkpoint_settings checkpoint;
  data_settings data;
  // [limits] host_memory in bytes (0: no budget); memory_plan.hpp plans within it.
  std::int64_t host_memory = 0;
  // [limits] device_memory in bytes (0: the device's free memory at start-up less a reserve):
  // a CUDA rank's device budget, device_plan.hpp plans within it.
  std::int64_t device_memory = 0;
  // [limits] gradient_partition: where ZeRO's gradient partition (stage 3, and stage 2 on
  // one pipeline stage) lives: "auto" (memory, unless the host budget needs it on NVMe),
  // "memory" or "nvme" (a file in the optimizer's NVMe swap folder: core/file_backed.hpp).
  std::string gradient_partition = "auto";
  bool grads_on_nvme = false; // the decision: "nvme", or "auto" moved by the plan
};

// Reads every key (marking it known), then checks for unknown ones, in one pass:
// every problem (unknown keys with the nearest known key, missing keys, invalid values,
// the scheduler included) is recorded in `problems` and reading goes on with defaults,
// so the result is meaningful only when `problems` stays empty. `default_run_dir` is
// used when the config has no run_dir. Paths may use ${VAR} (environment; DSA_DATA_DIR
// defaults to ./data-cache) and are taken relative to the working directory.
// `processes`: how many processes the job has (WORLD_SIZE under dsactor launch), each
// holding devices.ranks ranks (then 1); the batch rule counts ranks x processes.
run_config read_run_config(const config& cfg, const std::string& default_run_dir,
                           config_problems& problems, int processes = 1);
// As read_run_config, with every problem in one error (unknown keys first).
expected<run_config> parse_run_config(const config& cfg, const std::string& default_run_dir);

// ${VAR} expansion for paths.
std::string expand_path(const std::string& path);

} // namespace dsa::train
