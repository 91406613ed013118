// Parsing of the run config into plain structs.
#include "actors/train/config/run_config.hpp"

#include "kernels/cpu/gemm_bf16.hpp"
#include "actors/train/config/checkpointing_config.hpp"
#include "actors/train/config/pipeline_config.hpp"
#include "actors/train/config/limits_config.hpp"
#include "actors/train/config/layer_partition.hpp"
#include "optim/lr_schedule.hpp"
#include "optim/param_reader.hpp"

#include <cstdlib>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace dsa::train {
namespace {

using optim::param_reader;

void read_prepare(const config& cfg, data_settings& d, config_problems& problems) {
  if (!cfg.has("data.prepare"))
    return;
  prepare_settings p;
  param_reader r(cfg, "data.prepare", problems);
  r.require("corpus", p.corpus);
  r.require("out_dir", p.out_dir);
  r.read("vocab_size", p.vocab_size);
  r.read("seq_length", p.seq_length);
  r.read("max_predictions", p.max_predictions);
  r.read("dupe_factor", p.dupe_factor);
  r.read("short_seq_prob", p.short_seq_prob);
  r.read("masked_lm_prob", p.masked_lm_prob);
  r.read("holdout_docs", p.holdout_docs);
  r.read("instances_per_shard", p.instances_per_shard);
  r.read("block_mb", p.block_mb);
  std::int64_t seed = static_cast<std::int64_t>(p.seed);
  r.read("seed", seed);
  p.seed = static_cast<std::uint64_t>(seed);
  r.check_unknown();
  if (p.vocab_size < 110)
    r.invalid("vocab_size", "must be at least 110 (special tokens and characters)");
  if (p.seq_length < 8)
    r.invalid("seq_length", "must be at least 8");
  if (!(p.block_mb > 0 && p.block_mb <= 1 << 20))
    r.invalid("block_mb", "must be in (0, 1048576] (MB of corpus text per block)");
  p.corpus = expand_path(p.corpus);
  p.out_dir = expand_path(p.out_dir);
  if (d.vocab.empty()) d.vocab = p.out_dir + "/vocab.txt";
  if (d.train_shards.empty()) d.train_shards = p.out_dir + "/train";
  if (d.eval_shards.empty()) d.eval_shards = p.out_dir + "/holdout";
  d.prepare = p;
}

void read_prepare_qa(const config& cfg, data_settings& d, config_problems& problems) {
  if (!cfg.has("data.prepare_qa"))
    return;
  prepare_qa_settings p;
  param_reader r(cfg, "data.prepare_qa", problems);
  r.require("corpus", p.corpus);
  r.require("out_dir", p.out_dir);
  r.read("dev_fraction", p.dev_fraction);
  r.read("max_questions", p.max_questions);
  std::int64_t seed = static_cast<std::int64_t>(p.seed);
  r.read("seed", seed);
  p.seed = static_cast<std::uint64_t>(seed);
  r.check_unknown();
  if (!(p.dev_fraction > 0 && p.dev_fraction < 1))
    r.invalid("dev_fraction", "must be in (0, 1)");
  p.corpus = expand_path(p.corpus);
  p.out_dir = expand_path(p.out_dir);
  if (d.train_file.empty()) d.train_file = p.out_dir + "/train.json";
  if (d.dev_file.empty()) d.dev_file = p.out_dir + "/dev.json";
  d.prepare_qa = p;
}

void read_data(const config& cfg, const bert::bert_config& model, data_settings& d,
               config_problems& problems) {
  param_reader r(cfg, "data", problems);
  r.read("vocab", d.vocab);
  r.read("lower_case", d.lower_case);
  r.read("train_shards", d.train_shards);
  r.read("eval_shards", d.eval_shards);
  r.read("shuffle_buffer", d.shuffle_buffer);
  r.read("dynamic_masking", d.dynamic_masking);
  r.read("eval_batches", d.eval_batches);
  r.read("train_file", d.train_file);
  r.read("dev_file", d.dev_file);
  r.read("max_seq_length", d.max_seq_length);
  r.read("doc_stride", d.doc_stride);
  r.read("max_query_length", d.max_query_length);
  r.read("n_best_size", d.n_best_size);
  r.read("max_answer_length", d.max_answer_length);
  r.accept("prepare");
  r.accept("prepare_qa");
  r.check_unknown();
  for (std::string* p : {&d.vocab, &d.train_shards, &d.eval_shards, &d.train_file, &d.dev_file}) *p = expand_path(*p);
  read_prepare(cfg, d, problems);
  read_prepare_qa(cfg, d, problems);
  auto missing = [&](const char* key, const char* message) {
    problems.add(cfg.problem(problem_kind::missing_key, key, message));
  };
  if (d.vocab.empty() && (model.head == bert::head_kind::squad || d.dynamic_masking))
    missing("data.vocab", "required to tokenize SQuAD text or mask dynamically (a BERT vocab.txt)");
  if (model.head == bert::head_kind::pretraining && d.train_shards.empty())
    missing("data.train_shards",
            "required for pre-training (a directory of shards), or give [data.prepare]");
  if (model.head == bert::head_kind::squad && d.train_file.empty())
    missing("data.train_file", "required for SQuAD fine-tuning (a SQuAD v1.1 JSON file)");
  if (d.shuffle_buffer < 1)
    r.invalid("shuffle_buffer", "must be at least 1");
  if (d.doc_stride < 1 || d.max_query_length < 1 || d.max_seq_length < d.max_query_length + 3)
    r.invalid("max_seq_length",
              "SQuAD lengths must satisfy max_seq_length >= max_query_length + 3");
}

void read_checkpoint(const config& cfg, checkpoint_settings& c, config_problems& problems) {
  param_reader r(cfg, "checkpoint", problems);
  r.read("dir", c.dir);
  r.read("save_interval", c.save_interval);
  r.read("keep_last", c.keep_last);
  r.read("save_final", c.save_final);
  r.read("load_error_feedback", c.load_error_feedback);
  if (r.has("load")) {
    // A step number or a string.
    if (auto n = cfg.get<std::int64_t>("checkpoint.load")) c.load = std::to_string(*n);
    else
      r.read("load", c.load);
  } else {
    r.accept("load");
  }
  r.check_unknown();
  if (c.save_interval < 0)
    r.invalid("save_interval", "must be >= 0");
  if (c.keep_last < 0)
    r.invalid("keep_last", "must be >= 0");
  c.dir = expand_path(c.dir);
}

// DeepSpeed keys about data-parallel gradient averaging and ZeRO that BERT configs
// carry. With one data-parallel replica the averaging keys change nothing, so any
// valid value is accepted; what would change the run and is not built yet is an error.
// DeepSpeed's zero_optimization keys with scalar values (runtime/zero/config.py,
// aliases included); the table-valued ones are in zero_optimization_tables.
constexpr const char* zero_optimization_keys[] = {
    "contiguous_gradients", "reduce_scatter", "reduce_bucket_size", "allgather_partitions",
    "allgather_bucket_size", "overlap_comm", "load_from_fp32_weights", "elastic_checkpoint",
    "sub_group_size", "cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory",
    "prefetch_bucket_size", "stage3_prefetch_bucket_size", "param_persistence_threshold",
    "stage3_param_persistence_threshold", "model_persistence_threshold",
    "stage3_model_persistence_threshold", "max_live_parameters", "stage3_max_live_parameters",
    "max_reuse_distance", "stage3_max_reuse_distance", "gather_16bit_weights_on_model_save",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params",
    "module_granularity_threshold", "stage3_module_granularity_threshold", "allgather_sequential",
    "stage3_allgather_sequential", "partition_stream_chunk_size", "stage3_partition_stream_chunk_size",
    "use_multi_rank_bucket_allreduce", "enable_sanity_checks", "ignore_unused_parameters",
    "legacy_stage1", "round_robin_gradients", "zero_hpz_partition_size", "zero_quantized_weights",
    "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "mics_shard_size",
    "mics_hierarchical_params_gather", "memory_efficient_linear", "pipeline_loading_checkpoint",
    "override_module_apply", "log_trace_cache_warnings", "save_muon_momentum_buffer_in_memory"};
constexpr const char* zero_optimization_tables[] = {"zeropp_loco_param",
                                                    "zenflow", "leaf_module"};

void read_devices(const config& cfg, run_config& rc, config_problems& problems, int processes) {
  param_reader r(cfg, "devices", problems);
  r.read("ranks", rc.ranks);
  r.read("shared_memory_allreduce", rc.shared_memory_allreduce);
  r.read("backend", rc.backend);
  r.read("device", rc.device);
  r.read("deterministic", rc.deterministic);
  r.check_unknown();
  if (rc.backend != "cpu" && rc.backend != "cuda") {
    r.invalid("backend", fmt::format("expected \"cpu\" or \"cuda\", got \"{}\"", rc.backend));
    rc.backend = "cpu";
  }
  if (rc.device < -1) {
    r.invalid("device", fmt::format("expected a device index >= 0 (or -1: the local rank), got {}", rc.device));
    rc.device = -1;
  }
  if (rc.ranks < 1 || rc.ranks > 64) {
    r.invalid("ranks", fmt::format("must be in 1..64, got {}", rc.ranks));
    rc.ranks = 1;
  } else if (processes > 1 && rc.ranks > 1) {
    r.invalid("ranks", fmt::format("must be 1 in a job of {} processes (dsactor launch gives each process one "
                                   "rank), got {}",
                                   processes, rc.ranks));
    rc.ranks = 1;
  }
  rc.processes = processes;
}

void read_comms_logger(const config& cfg, run_config& rc, config_problems& problems) {
  param_reader r(cfg, "comms_logger", problems);
  auto& o = rc.comms_logger;
  r.read("enabled", o.enabled);
  r.read("verbose", o.verbose);
  r.read("prof_all", o.prof_all);
  r.read("debug", o.debug);
  r.read("prof_ops", o.prof_ops);
  r.check_unknown();
  const auto& known = net::comms_logger_ops();
  for (const auto& op : o.prof_ops)
    if (std::find(known.begin(), known.end(), op) == known.end())
      r.invalid("prof_ops", fmt::format("unknown operation '{}'; known: {}", op, fmt::join(known, ", ")));
}

void read_data_parallel_keys(const config& cfg, run_config& rc, config_problems& problems) {
  auto invalid = [&](const char* key, std::string message) {
    problems.add(cfg.problem(problem_kind::invalid_value, key, std::move(message)));
  };
  bool prescale = false, sparse = false, zero_allow = false;
  double predivide = 1.0;
  std::int64_t zero = 0;
  cfg.read("prescale_gradients", prescale, problems);
  cfg.read("gradient_predivide_factor", predivide, problems);
  if (!(predivide > 0))
    invalid("gradient_predivide_factor", "must be > 0");
  cfg.read("sparse_gradients", sparse, problems);
  if (sparse)
    invalid("sparse_gradients", "sparse embedding gradients are not supported; set false");
  cfg.read("zero_allow_untested_optimizer", zero_allow, problems);
  // DeepSpeed's elastic batch rules: a disabled section is accepted, an enabled one refused.
  if (cfg.has("elasticity")) {
    bool elastic = false;
    cfg.read("elasticity.enabled", elastic, problems);
    cfg.accept("elasticity");
    if (elastic)
      invalid("elasticity.enabled",
              "DeepSpeed's elastic batch rules are not read; set false. `dsactor launch --max_restarts` restarts a "
              "job on the hosts that still answer and keeps train_batch_size by accumulating more micro-batches "
              "(docs/launch.md)");
  }
  // DeepSpeed's deprecated boolean form: false is stage 0, true stage 1.
  if (const toml::node* z = cfg.table().at_path("zero_optimization").node(); z && z->is_boolean()) {
    cfg.accept("zero_optimization");
    zero = z->value_or(false) ? 1 : 0;
  } else {
    cfg.read("zero_optimization.stage", zero, problems);
  }
  if (zero < 0 || zero > 3) {
    invalid("zero_optimization.stage", fmt::format("must be 0, 1, 2 or 3, got {}", zero));
  } else if (zero == 3 && rc.stages > 1) {
    // As DeepSpeed (pipe/engine.py refuses ZeRO-2/3 with pipelines): a fetcher gathers a
    // stage's layers in one fixed order, which a pipeline's interleaving does not give.
    invalid("zero_optimization.stage",
            fmt::format("ZeRO stage 3 partitions the weights of a single pipeline stage over the data-parallel ranks; "
                        "it cannot run with pipeline.stages = {} (set pipeline.stages = 1, or stage 1 or 2)",
                        rc.stages));
  } else if (zero == 3 && rc.schedule != "1f1b") {
    invalid("zero_optimization.stage",
            fmt::format("ZeRO stage 3 needs pipeline.schedule = \"1f1b\" (each micro-batch's forward and backward "
                        "back to back, so every rank gathers the layers in the same order); got \"{}\"",
                        rc.schedule));
  } else {
    rc.zero_stage = static_cast<int>(zero);
  }
  // ZeRO-3's fetcher: DeepSpeed's keys with and without the stage3_ prefix, in elements.
  auto read_elements = [&](const char* key, std::int64_t& out) {
    for (const std::string& name : {fmt::format("zero_optimization.stage3_{}", key), fmt::format("zero_optimization.{}", key)}) {
      double v = static_cast<double>(out);
      if (!cfg.has(name)) continue;
      cfg.read(name, v, problems);
      if (!(v >= 0 && v <= 9e15 && v == std::floor(v)))
        invalid(name.c_str(), fmt::format("must be a whole number of elements >= 0, got {}", v));
      else
        out = static_cast<std::int64_t>(v);
    }
  };
  read_elements("prefetch_bucket_size", rc.stage3_prefetch);
  read_elements("param_persistence_threshold", rc.stage3_persistence);
  read_elements("max_live_parameters", rc.stage3_max_live);
  // Stage 0 ignores the section's other keys, but like DeepSpeed (whose config
  // models forbid extra fields) a key it does not know is an error.
  // DeepSpeed configs write bucket sizes as 5e8 (a float in JSON and TOML).
  double bucket = static_cast<double>(rc.reduce_bucket_elements);
  cfg.read("zero_optimization.reduce_bucket_size", bucket, problems);
  if (!(bucket >= 1 && bucket <= 9e15 && bucket == std::floor(bucket)))
    invalid("zero_optimization.reduce_bucket_size", fmt::format("must be a whole number of elements >= 1, got {}", bucket));
  else
    rc.reduce_bucket_elements = static_cast<std::int64_t>(bucket);
  cfg.read("zero_optimization.overlap_comm", rc.overlap_comm, problems);
  for (const char* key : zero_optimization_keys) cfg.know(fmt::format("zero_optimization.{}", key));
  for (const char* table : zero_optimization_tables) cfg.accept(fmt::format("zero_optimization.{}", table));
}

void read_precision(const config& cfg, run_config& rc, config_problems& problems) {
  bool fp16 = false, bf16 = false;
  cfg.read("fp16.enabled", fp16, problems);
  cfg.read("bf16.enabled", bf16, problems);
  if (fp16 && bf16)
    problems.add(cfg.problem(problem_kind::invalid_value, "bf16.enabled",
                             "fp16 and bf16 cannot both be enabled"));
  if (fp16) {
    rc.working = precision::f16;
    rc.scaler =
        optim::read_loss_scaler_params(cfg, optim::loss_scaler_flavour::fp16_optimizer, problems);
    if (rc.optimizer.lamb_like() && rc.scaler.loss_scale > 0)
      problems.add(
          cfg.problem(problem_kind::invalid_value, "fp16.loss_scale",
                      "LAMB requires dynamic loss scaling (loss_scale = 0), as in DeepSpeed"));
  } else {
    // Off: the section's keys are still checked, so a misspelt `enabled` is not
    // silently taken for fp32.
    config_problems ignored_values;
    (void)optim::read_loss_scaler_params(cfg, optim::loss_scaler_flavour::fp16_optimizer, ignored_values);
  }
  if (bf16) rc.working = precision::bf16;
  cfg.read("bf16.cpu_gemm", rc.bf16_cpu_gemm, problems);
  if (rc.bf16_cpu_gemm) {
    std::string why;
    if (!bf16)
      problems.add(cfg.problem(problem_kind::invalid_value, "bf16.cpu_gemm", "needs bf16.enabled = true"));
    else if (!cpu::bf16_gemm_supported(&why))
      problems.add(cfg.problem(problem_kind::invalid_value, "bf16.cpu_gemm",
                               fmt::format("bf16 GEMM cannot run here: {}", why)));
  }
  // DeepSpeed's other precision keys. The CPU computes in f32 and casts nothing
  // automatically, so auto_cast and the bf16 update/overflow switches change
  // nothing here; master weights, gradients or optimizer state in half cannot be
  // honoured (they are f32), so asking for them is an error.
  cfg.know("fp16.auto_cast");
  cfg.know("bf16.immediate_grad_update");
  cfg.know("bf16.check_grad_overflow");
  for (const char* key :
       {"fp16.fp16_master_weights_and_grads", "bf16.bf16_master_weights_and_grads", "bf16.bf16_optimizer_states"}) {
    bool half_state = false;
    cfg.read(key, half_state, problems);
    if (half_state)
      problems.add(cfg.problem(problem_kind::invalid_value, key,
                               "master weights, gradients and optimizer state are fp32 in dsactor; set false"));
  }
}

// train_steps or epochs: exactly one of them, not negative.
void read_length(const config& cfg, run_config& rc, config_problems& problems) {
  const std::size_t before = problems.size();
  cfg.read("train_steps", rc.train_steps, problems);
  cfg.read("epochs", rc.epochs, problems);
  if (problems.size() != before)
    return; // a mistyped length is reported once
  auto add = [&](problem_kind kind, const char* key, const char* message) {
    problems.add(cfg.problem(kind, key, message));
  };
  if (rc.train_steps < 0)
    add(problem_kind::invalid_value, "train_steps", "must be >= 0");
  if (rc.epochs < 0)
    add(problem_kind::invalid_value, "epochs", "must be >= 0");
  if (rc.train_steps == 0 && rc.epochs == 0)
    add(cfg.has("train_steps") || cfg.has("epochs") ? problem_kind::invalid_value
                                                    : problem_kind::missing_key,
        "train_steps", "give the run's length as 'train_steps' (optimizer steps) or 'epochs'");
  if (rc.train_steps > 0 && rc.epochs > 0)
    add(problem_kind::invalid_value, "epochs", "give either train_steps or epochs, not both");
}

} // namespace

std::string expand_path(const std::string& path) {
  std::string out;
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '$' && i + 1 < path.size() && path[i + 1] == '{') {
      std::size_t close = path.find('}', i + 2);
      if (close != std::string::npos) {
        std::string name = path.substr(i + 2, close - i - 2);
        const char* value = std::getenv(name.c_str());
        if (value) out += value;
        else if (name == "DSA_DATA_DIR") out += "data-cache";
        i = close;
        continue;
      }
    }
    out += path[i];
  }
  return out;
}

run_config read_run_config(const config& cfg, const std::string& default_run_dir,
                           config_problems& problems, int processes) {
  run_config rc;
  rc.config_path = cfg.source();
  rc.run_dir = default_run_dir;
  cfg.read("run_dir", rc.run_dir, problems);
  rc.run_dir = expand_path(rc.run_dir);
  read_devices(cfg, rc, problems, processes);
  const std::size_t before_layout = problems.size();
  read_pipeline(cfg, rc, problems, processes);
  // With stages across processes a replica is pipe_processes processes.
  rc.batch = read_batch_config(cfg, rc.ranks * processes / rc.pipe_processes, problems);
  rc.model = bert::read_bert_config(cfg, problems, "model");
  cfg.read("init_checkpoint", rc.init_checkpoint, problems);
  rc.init_checkpoint = expand_path(rc.init_checkpoint);
  if (cfg.has("optimizer"))
    rc.optimizer = optim::read_optimizer_config(cfg, problems, "optimizer");
  else
    problems.add(
        cfg.problem(problem_kind::missing_key, "optimizer",
                    "required table is missing (type = Adam, AdamW or Lamb, with its params)"));
  rc.has_scheduler = cfg.has("scheduler");
  // Checked here; each optimizer shard makes its own schedule at start.
  if (rc.has_scheduler)
    (void)optim::read_lr_schedule(cfg, rc.optimizer.lr, problems);
  read_precision(cfg, rc, problems);
  rc.cpu_checkpointing = read_activation_checkpointing(cfg, problems);
  cfg.read("gradient_clipping", rc.gradient_clipping, problems);
  // The layout is checked against the model here rather than when the stages are built.
  if (problems.size() == before_layout)
    if (auto ranges = partition_layers(rc.model, rc.stages, rc.partition); !ranges)
      problems.add(
          cfg.problem(problem_kind::invalid_value,
                      rc.stages > rc.model.num_layers ? "pipeline.stages" : "pipeline.partition",
                      ranges.err().message));
  read_length(cfg, rc, problems);
  cfg.read("steps_per_print", rc.steps_per_print, problems);
  cfg.read("wall_clock_breakdown", rc.wall_clock_breakdown, problems);
  std::int64_t seed = 42;
  cfg.read("seed", seed, problems);
  rc.seed = static_cast<std::uint64_t>(seed);
  cfg.read("watchdog_seconds", rc.watchdog_seconds, problems);
  if (rc.watchdog_seconds < 1 || rc.watchdog_seconds > 30 * 86400)
    problems.add(cfg.problem(
        problem_kind::invalid_value, "watchdog_seconds",
        fmt::format("must be between 1 and 2592000 (30 days), got {}", rc.watchdog_seconds)));
  cfg.read("debug.fail_stage", rc.fail_stage, problems);
  cfg.read("debug.fail_step", rc.fail_step, problems);
  cfg.read("debug.fail_optimizer_step", rc.fail_optimizer_step, problems);
  cfg.read("debug.overflow_step", rc.overflow_step, problems);
  cfg.read("debug.host_optimizer_device", rc.host_optimizer_device, problems);
  cfg.read("debug.stream_host_update", rc.stream_host_update, problems);
  if (rc.overflow_step >= 0 && rc.working != precision::f16)
    problems.add(cfg.problem(problem_kind::invalid_value, "debug.overflow_step",
                             "needs fp16.enabled = true (an overflow is what fp16's loss scaler handles)"));
  read_checkpoint(cfg, rc.checkpoint, problems);
  if (rc.checkpoint.dir.empty()) rc.checkpoint.dir = rc.run_dir + "/checkpoints";
  read_data(cfg, rc.model, rc.data, problems);
  read_data_parallel_keys(cfg, rc, problems);
  read_offload(cfg, rc.zero_stage, rc.offload, problems);
  if (rc.optimizer.compressed()) {
    // The three run over ZeRO's partitions (partitioned_optimizer::step_onebit), stages 1 and 2.
    const char* name = optim::optimizer_name(rc.optimizer.type);
    if (rc.zero_stage >= 3)
      problems.add(cfg.problem(problem_kind::invalid_value, "zero_optimization.stage",
                               fmt::format("{} runs with ZeRO stages 0, 1 and 2 (stage 3 would partition the weights "
                                           "its whole local state is built against); got stage 3", name)));
    if (rc.zero_stage == 2 && rc.offload.device == offload_device::none) {
      // Each rank compresses state built from its whole local gradient: the gradients
      // cannot be partitioned as stage 2 does.
      rc.zero_stage = 1;
      rc.zero_note = fmt::format("zero_optimization.stage 2 runs as stage 1 with {0}: {0} compresses each rank's "
                                 "whole local {1}, so every rank keeps its whole gradients (the optimizer state "
                                 "stays partitioned)", name,
                                 rc.optimizer.type == optim::optimizer_type::zeroone_adam ? "gradients and moves"
                                                                                         : "momentum");
    }
    if (rc.offload.device != offload_device::none)
      problems.add(cfg.problem(problem_kind::invalid_value, "zero_optimization.offload_optimizer.device",
                               fmt::format("{} keeps its state in memory; offloading it is not supported", name)));
  }
  read_comms_logger(cfg, rc, problems);
  read_limits(cfg, rc, problems);
  // The injected overflow goes into the whole gradients a stage hands its reducer; a
  // partitioned stage (ZeRO-3, ZeRO-2 on one stage) sums into its partition instead.
  if (rc.overflow_step >= 0 && rc.gradients_partitioned())
    problems.add(cfg.problem(problem_kind::invalid_value, "debug.overflow_step",
                             fmt::format("injects into whole stage gradients; ZeRO stage {} over {} ranks partitions "
                                         "them", rc.zero_stage, rc.batch.data_parallel_size)));
  check_pipeline_combinations(cfg, rc, problems);
  cfg.has("deepspeed_config");
  cfg.check_unknown(problems);
  return rc;
}

expected<run_config> parse_run_config(const config& cfg, const std::string& default_run_dir) {
  config_problems problems;
  run_config rc = read_run_config(cfg, default_run_dir, problems);
  DSA_TRY(problems.to_status());
  return rc;
}

} // namespace dsa::train
