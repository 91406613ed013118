// Parsing of the run config into plain structs.
#include "actors/train/run_config.hpp"

#include "optim/param_reader.hpp"

#include <cstdlib>
#include <fmt/format.h>

namespace dsa::train {
namespace {

using optim::param_reader;

status read_prepare(const config& cfg, data_settings& d) {
  if (!cfg.has("data.prepare")) return {};
  prepare_settings p;
  param_reader r(cfg, "data.prepare");
  DSA_TRY(r.require("corpus", p.corpus));
  DSA_TRY(r.require("out_dir", p.out_dir));
  DSA_TRY(r.read("vocab_size", p.vocab_size));
  DSA_TRY(r.read("seq_length", p.seq_length));
  DSA_TRY(r.read("max_predictions", p.max_predictions));
  DSA_TRY(r.read("dupe_factor", p.dupe_factor));
  DSA_TRY(r.read("short_seq_prob", p.short_seq_prob));
  DSA_TRY(r.read("masked_lm_prob", p.masked_lm_prob));
  DSA_TRY(r.read("holdout_docs", p.holdout_docs));
  DSA_TRY(r.read("instances_per_shard", p.instances_per_shard));
  std::int64_t seed = static_cast<std::int64_t>(p.seed);
  DSA_TRY(r.read("seed", seed));
  p.seed = static_cast<std::uint64_t>(seed);
  DSA_TRY(r.reject_unknown());
  if (p.vocab_size < 110) return r.value_error("vocab_size", "must be at least 110 (special tokens and characters)");
  if (p.seq_length < 8) return r.value_error("seq_length", "must be at least 8");
  p.corpus = expand_path(p.corpus);
  p.out_dir = expand_path(p.out_dir);
  if (d.vocab.empty()) d.vocab = p.out_dir + "/vocab.txt";
  if (d.train_shards.empty()) d.train_shards = p.out_dir + "/train";
  if (d.eval_shards.empty()) d.eval_shards = p.out_dir + "/holdout";
  d.prepare = p;
  return {};
}

status read_prepare_qa(const config& cfg, data_settings& d) {
  if (!cfg.has("data.prepare_qa")) return {};
  prepare_qa_settings p;
  param_reader r(cfg, "data.prepare_qa");
  DSA_TRY(r.require("corpus", p.corpus));
  DSA_TRY(r.require("out_dir", p.out_dir));
  DSA_TRY(r.read("dev_fraction", p.dev_fraction));
  DSA_TRY(r.read("max_questions", p.max_questions));
  std::int64_t seed = static_cast<std::int64_t>(p.seed);
  DSA_TRY(r.read("seed", seed));
  p.seed = static_cast<std::uint64_t>(seed);
  DSA_TRY(r.reject_unknown());
  if (!(p.dev_fraction > 0 && p.dev_fraction < 1)) return r.value_error("dev_fraction", "must be in (0, 1)");
  p.corpus = expand_path(p.corpus);
  p.out_dir = expand_path(p.out_dir);
  if (d.train_file.empty()) d.train_file = p.out_dir + "/train.json";
  if (d.dev_file.empty()) d.dev_file = p.out_dir + "/dev.json";
  d.prepare_qa = p;
  return {};
}

status read_data(const config& cfg, const bert::bert_config& model, data_settings& d) {
  param_reader r(cfg, "data");
  DSA_TRY(r.read("vocab", d.vocab));
  DSA_TRY(r.read("lower_case", d.lower_case));
  DSA_TRY(r.read("train_shards", d.train_shards));
  DSA_TRY(r.read("eval_shards", d.eval_shards));
  DSA_TRY(r.read("shuffle_buffer", d.shuffle_buffer));
  DSA_TRY(r.read("dynamic_masking", d.dynamic_masking));
  DSA_TRY(r.read("eval_batches", d.eval_batches));
  DSA_TRY(r.read("train_file", d.train_file));
  DSA_TRY(r.read("dev_file", d.dev_file));
  DSA_TRY(r.read("max_seq_length", d.max_seq_length));
  DSA_TRY(r.read("doc_stride", d.doc_stride));
  DSA_TRY(r.read("max_query_length", d.max_query_length));
  DSA_TRY(r.read("n_best_size", d.n_best_size));
  DSA_TRY(r.read("max_answer_length", d.max_answer_length));
  r.accept("prepare");
  r.accept("prepare_qa");
  DSA_TRY(r.reject_unknown());
  for (std::string* p : {&d.vocab, &d.train_shards, &d.eval_shards, &d.train_file, &d.dev_file}) *p = expand_path(*p);
  DSA_TRY(read_prepare(cfg, d));
  DSA_TRY(read_prepare_qa(cfg, d));
  if (d.vocab.empty() && (model.head == bert::head_kind::squad || d.dynamic_masking))
    return cfg.key_error("data.vocab", "required to tokenize SQuAD text or mask dynamically (a BERT vocab.txt)");
  if (model.head == bert::head_kind::pretraining && d.train_shards.empty())
    return cfg.key_error("data.train_shards", "required for pre-training (a directory of shards), or give [data.prepare]");
  if (model.head == bert::head_kind::squad && d.train_file.empty())
    return cfg.key_error("data.train_file", "required for SQuAD fine-tuning (a SQuAD v1.1 JSON file)");
  if (d.shuffle_buffer < 1) return r.value_error("shuffle_buffer", "must be at least 1");
  if (d.doc_stride < 1 || d.max_query_length < 1 || d.max_seq_length < d.max_query_length + 3)
    return r.value_error("max_seq_length", "SQuAD lengths must satisfy max_seq_length >= max_query_length + 3");
  return {};
}

status read_checkpoint(const config& cfg, checkpoint_settings& c) {
  param_reader r(cfg, "checkpoint");
  DSA_TRY(r.read("dir", c.dir));
  DSA_TRY(r.read("save_interval", c.save_interval));
  DSA_TRY(r.read("keep_last", c.keep_last));
  DSA_TRY(r.read("save_final", c.save_final));
  if (r.has("load")) {
    // A step number or a string.
    if (auto n = cfg.get<std::int64_t>("checkpoint.load")) c.load = std::to_string(*n);
    else DSA_TRY(r.read("load", c.load));
  } else {
    r.accept("load");
  }
  DSA_TRY(r.reject_unknown());
  if (c.save_interval < 0) return r.value_error("save_interval", "must be >= 0");
  if (c.keep_last < 0) return r.value_error("keep_last", "must be >= 0");
  c.dir = expand_path(c.dir);
  return {};
}

status read_pipeline(const config& cfg, run_config& rc) {
  param_reader r(cfg, "pipeline");
  std::int64_t stages = 1;
  DSA_TRY(r.read("stages", stages));
  DSA_TRY(r.read("partition", rc.partition));
  DSA_TRY(r.read("schedule", rc.schedule));
  DSA_TRY(r.reject_unknown());
  if (stages < 1 || stages > 64) return r.value_error("stages", fmt::format("must be in 1..64, got {}", stages));
  if (rc.schedule != "1f1b" && rc.schedule != "gpipe")
    return r.value_error("schedule", fmt::format("expected '1f1b' or 'gpipe', got '{}'", rc.schedule));
  rc.stages = static_cast<std::uint32_t>(stages);
  return {};
}

// DeepSpeed keys about data-parallel gradient averaging and ZeRO that BERT configs
// carry. With one data-parallel replica the averaging keys change nothing, so any
// valid value is accepted; what would change the run and is not built yet is an error.
status read_data_parallel_keys(const config& cfg) {
  DSA_TRY(cfg.get_or<bool>("prescale_gradients", false));
  DSA_ASSIGN_OR_RETURN(double predivide, cfg.get_or<double>("gradient_predivide_factor", 1.0));
  if (!(predivide > 0)) return cfg.key_error("gradient_predivide_factor", "must be > 0");
  DSA_ASSIGN_OR_RETURN(bool sparse, cfg.get_or<bool>("sparse_gradients", false));
  if (sparse) return cfg.key_error("sparse_gradients", "sparse embedding gradients are not supported; set false");
  DSA_TRY(cfg.get_or<bool>("zero_allow_untested_optimizer", false));
  DSA_ASSIGN_OR_RETURN(std::int64_t zero, cfg.get_or<std::int64_t>("zero_optimization.stage", 0));
  if (zero != 0)
    return cfg.key_error("zero_optimization.stage",
                         fmt::format("ZeRO stage {} is not supported yet; set 0 (or remove the section)", zero));
  cfg.accept("zero_optimization"); // stage 0: DeepSpeed ignores the section's other keys
  return {};
}

status read_precision(const config& cfg, run_config& rc) {
  bool fp16 = false, bf16 = false;
  DSA_ASSIGN_OR_RETURN(fp16, cfg.get_or<bool>("fp16.enabled", false));
  DSA_ASSIGN_OR_RETURN(bf16, cfg.get_or<bool>("bf16.enabled", false));
  if (fp16 && bf16) return cfg.key_error("bf16.enabled", "fp16 and bf16 cannot both be enabled");
  if (fp16) {
    rc.working = precision::f16;
    DSA_ASSIGN_OR_RETURN(rc.scaler, optim::parse_loss_scaler_params(cfg, optim::loss_scaler_flavour::fp16_optimizer));
    if (rc.optimizer.type == optim::optimizer_type::lamb && rc.scaler.loss_scale > 0)
      return cfg.key_error("fp16.loss_scale", "LAMB requires dynamic loss scaling (loss_scale = 0), as in DeepSpeed");
  } else {
    cfg.accept("fp16");
  }
  if (bf16) rc.working = precision::bf16;
  return {};
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

expected<run_config> parse_run_config(const config& cfg, const std::string& default_run_dir) {
  run_config rc;
  rc.config_path = cfg.source();
  DSA_ASSIGN_OR_RETURN(rc.run_dir, cfg.get_or<std::string>("run_dir", default_run_dir));
  rc.run_dir = expand_path(rc.run_dir);
  DSA_ASSIGN_OR_RETURN(rc.batch, resolve_batch_config(cfg, 1));
  DSA_ASSIGN_OR_RETURN(rc.model, bert::parse_bert_config(cfg, "model"));
  DSA_ASSIGN_OR_RETURN(rc.init_checkpoint, cfg.get_or<std::string>("init_checkpoint", ""));
  rc.init_checkpoint = expand_path(rc.init_checkpoint);
  if (!cfg.has("optimizer")) return make_error(errc::config, "{}: missing required table 'optimizer'", cfg.source());
  DSA_ASSIGN_OR_RETURN(rc.optimizer, optim::parse_optimizer_config(cfg, "optimizer"));
  rc.has_scheduler = cfg.has("scheduler");
  if (rc.has_scheduler) cfg.accept("scheduler"); // read by the schedule factory at start
  DSA_TRY(read_precision(cfg, rc));
  DSA_ASSIGN_OR_RETURN(rc.gradient_clipping, cfg.get_or<double>("gradient_clipping", 1.0));
  DSA_TRY(read_pipeline(cfg, rc));
  DSA_ASSIGN_OR_RETURN(rc.train_steps, cfg.get_or<std::int64_t>("train_steps", 0));
  DSA_ASSIGN_OR_RETURN(rc.epochs, cfg.get_or<double>("epochs", 0.0));
  if (rc.train_steps < 0) return cfg.key_error("train_steps", "must be >= 0");
  if (rc.epochs < 0) return cfg.key_error("epochs", "must be >= 0");
  if (rc.train_steps == 0 && rc.epochs == 0)
    return make_error(errc::config, "{}: give the run's length as 'train_steps' (optimizer steps) or 'epochs'",
                      cfg.source());
  if (rc.train_steps > 0 && rc.epochs > 0) return cfg.key_error("epochs", "give either train_steps or epochs, not both");
  DSA_ASSIGN_OR_RETURN(rc.steps_per_print, cfg.get_or<std::int64_t>("steps_per_print", 10));
  DSA_ASSIGN_OR_RETURN(rc.wall_clock_breakdown, cfg.get_or<bool>("wall_clock_breakdown", false));
  std::int64_t seed = 42;
  DSA_ASSIGN_OR_RETURN(seed, cfg.get_or<std::int64_t>("seed", 42));
  rc.seed = static_cast<std::uint64_t>(seed);
  DSA_ASSIGN_OR_RETURN(rc.watchdog_seconds, cfg.get_or<std::int64_t>("watchdog_seconds", 600));
  if (rc.watchdog_seconds < 1 || rc.watchdog_seconds > 30 * 86400)
    return cfg.key_error("watchdog_seconds", fmt::format("must be between 1 and 2592000 (30 days), got {}",
                                                         rc.watchdog_seconds));
  DSA_ASSIGN_OR_RETURN(rc.fail_stage, cfg.get_or<std::int64_t>("debug.fail_stage", -1));
  DSA_ASSIGN_OR_RETURN(rc.fail_step, cfg.get_or<std::int64_t>("debug.fail_step", -1));
  DSA_ASSIGN_OR_RETURN(rc.fail_optimizer_step, cfg.get_or<std::int64_t>("debug.fail_optimizer_step", -1));
  DSA_TRY(read_checkpoint(cfg, rc.checkpoint));
  if (rc.checkpoint.dir.empty()) rc.checkpoint.dir = rc.run_dir + "/checkpoints";
  DSA_TRY(read_data(cfg, rc.model, rc.data));
  DSA_TRY(read_data_parallel_keys(cfg));
  cfg.has("deepspeed_config");
  DSA_TRY(cfg.reject_unknown());
  return rc;
}

} // namespace dsa::train
