// The run: configuration, data, stages, shards, restore, run, report.
#include "actors/train/trainer.hpp"

#include "actors/train/run_context.hpp"

#include "actors/run.hpp"
#include "actors/trace/chrome_export.hpp"
#include "actors/trace/trace_analysis.hpp"
#include "actors/train/bert_optimizer.hpp"
#include "actors/train/bert_stage.hpp"
#include "actors/train/data_prepare.hpp"
#include "actors/train/deepspeed_json.hpp"
#include "actors/train/evaluation.hpp"
#include "actors/train/feed_source.hpp"
#include "actors/train/memory_accounting.hpp"
#include "actors/train/metrics.hpp"
#include "actors/train/partition.hpp"
#include "actors/train/progress.hpp"
#include "actors/train/run_checkpoint.hpp"
#include "actors/train/run_config.hpp"
#include "actors/train/signals.hpp"
#include "core/log.hpp"
#include "io/ckpt/atomic_file.hpp"
#include "io/ckpt/safetensors.hpp"
#include "io/data/pretrain_shard.hpp"
#include "io/data/squad_dataset.hpp"
#include "io/net/local_transport.hpp"
#include "io/net/rendezvous_client.hpp"
#include "io/net/rendezvous_env.hpp"
#include "io/net/ucx_transport.hpp"
#include "models/bert/bert_state.hpp"
#include "optim/grad_clip.hpp"
#include "optim/lr_schedule.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>

namespace dsa::train {
namespace {
namespace fs = std::filesystem;

std::string default_run_dir(const std::string& config_path) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  return fmt::format("runs/{}-{}", fs::path(config_path).stem().string(), stamp);
}

// --resume without a run_dir in the config: the newest runs/<config name>-<time> that
// holds a checkpoint (names sort by time).
expected<std::string> run_dir_to_resume(const std::string& config_path) {
  const std::string prefix = fs::path(config_path).stem().string() + "-";
  std::string best;
  std::error_code ec;
  for (fs::directory_iterator it("runs", ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) == 0 && fs::exists(it->path() / "checkpoints" / "latest") && name > best) best = name;
  }
  if (best.empty())
    return make_error(errc::not_found, "--resume: no earlier run of {} with a checkpoint under runs/{}* (set run_dir "
                      "or checkpoint.load)", config_path, prefix);
  return "runs/" + best;
}

// The vocabulary, where data.vocab names one: tokenizing SQuAD text and dynamic masking
// need it; pre-training from shards alone takes the vocabulary size from their metadata.
expected<std::optional<tok::vocab>> load_vocab(run_context& ctx) {
  if (ctx.rc.data.prepare) DSA_TRY(prepare_pretraining_data(*ctx.rc.data.prepare, ctx.rc.data.vocab));
  if (ctx.rc.data.prepare_qa) DSA_TRY(prepare_qa_data(*ctx.rc.data.prepare_qa));
  if (ctx.rc.data.vocab.empty()) return std::optional<tok::vocab>();
  DSA_ASSIGN_OR_RETURN(auto v, tok::vocab::load(ctx.rc.data.vocab));
  if (!ctx.cfg.table().at_path("model.vocab_size").node()) ctx.rc.model.vocab_size = v.size();
  if (v.size() > ctx.rc.model.vocab_size)
    return ctx.cfg.key_error("model.vocab_size", fmt::format("{} is smaller than the vocabulary {} ({} tokens)",
                                                             ctx.rc.model.vocab_size, ctx.rc.data.vocab, v.size()));
  return std::optional<tok::vocab>(std::move(v));
}

// The held-out shards must share the training shards' vocabulary; checked before training
// rather than after it. Absent ones are left to the final evaluation, which warns.
status check_eval_shards(const data_settings& d, const data::shard_layout& train, const std::string& train_shard) {
  if (d.eval_shards.empty()) return {};
  auto shards = list_shards(d.eval_shards);
  if (!shards) return {};
  DSA_ASSIGN_OR_RETURN(auto reader, data::shard_reader::open(*shards, {}));
  const data::shard_layout& eval = reader.layout();
  if (eval.vocab_size != train.vocab_size || eval.vocab != train.vocab)
    return make_error(errc::config,
                      "data.eval_shards {} and data.train_shards {} come from different vocabularies (vocab_size {} "
                      "and {}, vocab_fingerprint '{}' and '{}')",
                      shards->front(), train_shard, eval.vocab_size, train.vocab_size, eval.vocab.fingerprint,
                      train.vocab.fingerprint);
  return {};
}

status make_provider(run_context& ctx) {
  const auto& d = ctx.rc.data;
  if (ctx.rc.model.head == bert::head_kind::pretraining) {
    DSA_ASSIGN_OR_RETURN(auto shards, list_shards(d.train_shards));
    data::shard_reader_options o;
    o.shuffle_buffer = d.shuffle_buffer;
    o.seed = ctx.rc.seed;
    if (d.dynamic_masking) {
      o.masking = data::masking_source::dynamic;
      o.vocab = data::masking_vocab::from(ctx.tokenizer->vocabulary());
    }
    DSA_ASSIGN_OR_RETURN(auto reader, data::shard_reader::open(shards, o));
    if (ctx.tokenizer)
      DSA_TRY(data::check_shard_vocab(reader.layout(), shards.front(), ctx.tokenizer->vocabulary(), d.vocab));
    else if (!ctx.cfg.table().at_path("model.vocab_size").node())
      ctx.rc.model.vocab_size = reader.layout().vocab_size;
    DSA_TRY(check_eval_shards(d, reader.layout(), shards.front()));
    if (reader.layout().vocab_size > ctx.rc.model.vocab_size || reader.layout().seq_length > ctx.rc.model.max_position_embeddings)
      return make_error(errc::config, "{}: shards (vocab {}, seq {}) do not fit the model (vocab {}, positions {})",
                        d.train_shards, reader.layout().vocab_size, reader.layout().seq_length, ctx.rc.model.vocab_size,
                        ctx.rc.model.max_position_embeddings);
    if (ctx.rank == 0)
      log_info("data: {} pre-training shard(s), {} sequences of {} tokens per epoch", shards.size(),
             reader.instances_per_epoch(), reader.layout().seq_length);
    ctx.provider = std::make_unique<pretrain_provider>(std::move(reader));
    return {};
  }
  DSA_ASSIGN_OR_RETURN(auto dataset, data::load_squad(d.train_file));
  auto examples = data::squad_read_examples(dataset, data::squad_mode::training);
  data::squad_feature_options fo;
  fo.max_seq_length = static_cast<int>(d.max_seq_length);
  fo.doc_stride = static_cast<int>(d.doc_stride);
  fo.max_query_length = static_cast<int>(d.max_query_length);
  fo.mode = data::squad_mode::training;
  DSA_ASSIGN_OR_RETURN(auto features, data::squad_convert_examples(examples.examples, *ctx.tokenizer, fo));
  for (auto& f : features) f.tokens.clear(); // training needs ids only
  log_info("data: {}: {} SQuAD questions -> {} training features; {} answers found away from answer_start "
           "(labelled where found); {} questions skipped ({} answers not in the context, {} not recoverable from "
           "the whitespace words)",
           d.train_file, examples.examples.size() + static_cast<std::size_t>(examples.skipped), features.size(),
           examples.moved, examples.skipped, examples.not_found, examples.skipped - examples.not_found);
  if (features.empty()) return make_error(errc::config, "{}: no training features", d.train_file);
  ctx.provider = std::make_unique<squad_provider>(std::move(features), ctx.rc.seed);
  return {};
}

status make_stages(run_context& ctx) {
  DSA_ASSIGN_OR_RETURN(ctx.ranges, partition_layers(ctx.rc.model, ctx.rc.stages, ctx.rc.partition));
  ckpt::named_tensors init;
  if (!ctx.rc.init_checkpoint.empty()) {
    DSA_ASSIGN_OR_RETURN(std::string file, weights_file_of(ctx.rc.init_checkpoint));
    DSA_ASSIGN_OR_RETURN(auto f, ckpt::read_safetensors(file));
    init = std::move(f.tensors);
    if (ctx.rank == 0) log_info("initial weights from {}", file);
  }
  for (std::uint32_t s = 0; s < ctx.rc.stages; ++s) {
    const auto M = static_cast<std::uint32_t>(ctx.rc.batch.gradient_accumulation);
    const auto R = static_cast<std::uint32_t>(ctx.rc.batch.data_parallel_size);
    bert_stage_options o;
    o.model = ctx.rc.model;
    o.range = ctx.ranges[s];
    o.micro_batches = M * R;
    o.micro_batch_offset = static_cast<std::uint32_t>(ctx.rank) * M;
    o.working = ctx.rc.working;
    o.seed = ctx.rc.seed;
    if (static_cast<std::int64_t>(s) == ctx.rc.fail_stage) o.fail_step = ctx.rc.fail_step;
    auto stage = std::make_unique<bert_stage>(o, ctx.shared);
    stage->part().parameters().init(ctx.rc.seed);
    if (!init.empty()) {
      bert::load_options lo;
      lo.head = bert::missing_head::keep_current;
      auto loaded = bert::load_state(stage->part().parameters(), init, lo);
      if (!loaded) return make_error(errc::format, "init_checkpoint {}: {}", ctx.rc.init_checkpoint, loaded.err().message);
    }
    const auto& params = stage->part().parameters();
    if (ctx.rank == 0)
      log_info("stage {}: model states per rank: {}{}; DeepSpeed's mixed-precision accounting for ZeRO stage {} on {} "
               "rank(s): {:.2f} MiB",
               s,
               expected_model_states(params.count(), ctx.rc.working, run_zero_sizes(ctx.rc, ctx.ranges[s])).describe(),
               run_zero_sizes(ctx.rc, ctx.ranges[s])
                   ? fmt::format(" (ZeRO stage 1: masters and moments of 1/{} of the stage)",
                                 ctx.rc.batch.data_parallel_size)
                   : fmt::format(" ({} bytes per parameter)", expected_model_states(1, ctx.rc.working).total()),
               ctx.rc.zero_stage, ctx.rc.batch.data_parallel_size,
               deepspeed_model_states(params.count(), ctx.rc.zero_stage,
                                      static_cast<int>(ctx.rc.batch.data_parallel_size)) /
                   (1 << 20));
    if (ctx.rank == 0)
      log_info("stage {}: {} ({} parameters, {:.2f} MiB of {} working weights)", s,
             ctx.ranges[s].to_string(), params.count(),
             static_cast<double>(params.value_bytes()) / (1 << 20),
             dtype_name(params.value_type()));
    ctx.stages.push_back(std::move(stage));
  }
  return {};
}

// One step_decider per shard, all alike (fed identical totals, they decide alike).
expected<std::vector<std::unique_ptr<step_decider>>> make_deciders(run_context& ctx) {
  step_decider_options o;
  o.base_lr = ctx.rc.optimizer.lr;
  o.clip = ctx.rc.gradient_clipping;
  o.scaling = ctx.rc.working == precision::f16;
  o.scaler = ctx.rc.scaler;
  std::vector<std::unique_ptr<step_decider>> out;
  for (std::uint32_t s = 0; s < ctx.rc.stages; ++s) {
    o.rank = static_cast<int>(s);
    std::unique_ptr<optim::lr_schedule> schedule;
    if (ctx.rc.has_scheduler) {
      DSA_ASSIGN_OR_RETURN(schedule, optim::make_lr_schedule(ctx.cfg, ctx.rc.optimizer.lr));
    }
    out.push_back(std::make_unique<step_decider>(o, std::move(schedule)));
  }
  return out;
}

// Restores a checkpoint into the stages and returns what the shards and the data need.
struct restored {
  std::map<std::string, tensor> masters;
  std::vector<optim::optimizer_state> optimizer_states;
  run_progress_state progress;
};

expected<restored> restore(run_context& ctx, const std::string& which) {
  DSA_ASSIGN_OR_RETURN(auto ck, ckpt::load_checkpoint(ctx.rc.checkpoint.dir, which));
  DSA_ASSIGN_OR_RETURN(auto progress, progress_from_json(ck.manifest.state, ck.dir));
  // The run must continue the saved one: same stages, precision and micro-batching.
  const std::string layout = describe_layout(ctx.ranges);
  if (progress.stages != ctx.rc.stages || progress.layout != layout)
    return make_error(errc::config, "{}: saved with the pipeline layout '{}'; this run has '{}' (pipeline.stages, "
                      "pipeline.partition)", ck.dir, progress.layout, layout);
  if (progress.precision != precision_name(ctx.rc.working))
    return make_error(errc::config, "{}: saved in {}; this run is {} (fp16.enabled, bf16.enabled)", ck.dir,
                      progress.precision, precision_name(ctx.rc.working));
  // The data continues where the saved run's global batches ended: the micro-batch and
  // the global batch must match; how a step's micro-batches split into accumulation
  // steps and ranks may change (every rank holds the whole state).
  const auto& b = ctx.rc.batch;
  if (progress.micro_batch_size != b.micro_batch_size ||
      progress.micro_batch_size * progress.gradient_accumulation * progress.data_parallel_size != b.train_batch_size)
    return make_error(errc::config,
                      "{}: saved with batches of {} = micro-batches of {} x {} accumulation steps x {} ranks; this "
                      "run has {} = {} x {} x {} (train_batch_size, train_micro_batch_size_per_gpu, "
                      "gradient_accumulation_steps, devices.ranks)",
                      ck.dir, progress.micro_batch_size * progress.gradient_accumulation * progress.data_parallel_size,
                      progress.micro_batch_size, progress.gradient_accumulation, progress.data_parallel_size,
                      b.train_batch_size, b.micro_batch_size, b.gradient_accumulation, b.data_parallel_size);
  auto model = ck.groups.find("model");
  if (model == ck.groups.end()) return make_error(errc::format, "{}: no model weights", ck.dir);
  restored r;
  r.masters = model->second;
  for (std::uint32_t s = 0; s < ctx.rc.stages; ++s) {
    auto loaded = bert::load_state(ctx.stages[s]->part().parameters(), r.masters, {});
    if (!loaded) return make_error(errc::format, "{}: model: {}", ck.dir, loaded.err().message);
    DSA_ASSIGN_OR_RETURN(auto st, optimizer_state_of(ck.groups, s, ck.dir));
    r.optimizer_states.push_back(std::move(st));
  }
  ctx.first_step = static_cast<std::uint32_t>(progress.next_step);
  DSA_TRY(ctx.provider->seek(progress.data_cursor));
  r.progress = std::move(progress);
  if (ctx.rank == 0) log_info("resumed from {} at step {}", ck.dir, ctx.first_step);
  return r;
}

// The whole model in f32 from the stages' working weights (for evaluation).
bert::bert_part assemble_whole(run_context& ctx) {
  bert::bert_part whole(ctx.rc.model, bert::bert_range::whole(ctx.rc.model));
  std::map<std::string, tensor> dict;
  for (auto& st : ctx.stages)
    for (const auto& e : st->part().parameters().entries())
      if (e.spec.role == bert::replica::owner) dict.emplace(e.spec.name, e.value);
  auto loaded = bert::load_state(whole.parameters(), dict, {});
  DSA_CHECK(loaded.has_value(), "assembling the stages into one model: {}", loaded.has_value() ? "" : loaded.err().message);
  return whole;
}

// This process as one rank of a job started by `dsactor launch` (RANK, WORLD_SIZE, ...
// in the environment): its UCX transport to the other processes and its rendezvous
// membership, which reports a lost rank by aborting the transport.
struct job_membership {
  net::rendezvous_env env;
  std::unique_ptr<net::ucx_transport> transport;
  std::unique_ptr<net::rendezvous_client> client;
};

// The UCX messages' job number from the launcher's token (FNV-1a of its text).
std::uint64_t token_number(const std::string& token) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : token) h = (h ^ c) * 1099511628211ull;
  return h;
}

net::bytes to_bytes(const std::string& s) {
  net::bytes b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

// Creates the transport, joins the rendezvous (every process must run the same config:
// a difference is an errc::config error naming the keys) and connects to every rank.
expected<job_membership> join_job(const net::rendezvous_env& env, const config& cfg) {
  job_membership job;
  job.env = env;
  DSA_ASSIGN_OR_RETURN(job.transport, net::ucx_transport::create(env.rank, env.world_size, token_number(env.job_token)));
  // Liveness comes from heartbeats and the launcher: waits at the rendezvous (all ranks
  // joining, rank 0 preparing the data) get no deadline of their own.
  net::rendezvous_options options = net::make_rendezvous_options(env);
  options.join_timeout = std::chrono::hours(24 * 7);
  DSA_ASSIGN_OR_RETURN(job.client,
                       net::rendezvous_client::join(
                           net::make_join_request(env, net::summarize_config(cfg.table()), job.transport->local_address()),
                           options));
  DSA_TRY(job.transport->connect(job.client->blobs()));
  // A lost rank or server fails every collective this process waits in.
  job.client->set_on_lost([t = job.transport.get()](const error& e) { t->abort(e); });
  return job;
}

// What one rank starts from beyond its run_context: its step deciders and, with
// checkpoint.load, the state it restored.
struct rank_start {
  std::vector<std::unique_ptr<step_decider>> deciders;
  std::optional<restored> resumed;
};

// Builds the rank's stages and deciders and restores checkpoint.load into them.
expected<rank_start> prepare_rank(run_context& ctx) {
  DSA_TRY(make_stages(ctx));
  rank_start st;
  DSA_ASSIGN_OR_RETURN(st.deciders, make_deciders(ctx));
  if (!ctx.rc.checkpoint.load.empty()) {
    DSA_ASSIGN_OR_RETURN(auto r, restore(ctx, ctx.rc.checkpoint.load));
    st.resumed = std::move(r);
    for (auto& d : st.deciders)
      d->restore(st.resumed->progress.schedule_iteration, st.resumed->progress.scaler,
                 st.resumed->progress.skipped_steps);
  }
  for (std::uint32_t s = 0; s < ctx.rc.stages; ++s) ctx.stages[s]->loss_scale() = st.deciders[s]->loss_scale();
  return st;
}

// One rank's part of the run: its share of the data, its optimizer shards, and
// the runtime's view of its stages and shards.
struct rank_run {
  std::unique_ptr<feed_source> source;
  std::vector<std::unique_ptr<bert_optimizer>> shards;
  actors::run_parts parts;
  std::int64_t last_contributed = -1; // ZeRO, ranks > 0: the last checkpoint step they gathered for
};

// ZeRO, a rank that does not write checkpoints: its shards' part of gathering the
// optimizer state for rank 0's checkpoint of `step` (the same collectives, in stage order).
void contribute_checkpoint(rank_run& run, std::uint32_t step) {
  for (auto& shard : run.shards) (void)shard->payload();
  run.last_contributed = step;
}

// transport: the rank's transport to the other ranks (null with one rank), for the
// shards' own communicators under ZeRO.
expected<rank_run> make_rank_run(run_context& ctx, rank_start& start, net::transport* transport) {
  const auto& rc = ctx.rc;
  rank_run rr;
  const bool zero = rc.zero_stage >= 1 && rc.batch.data_parallel_size > 1;
  const feed_share share{ctx.rank, static_cast<int>(rc.batch.data_parallel_size),
                         static_cast<std::uint32_t>(rc.batch.gradient_accumulation)};
  rr.source = std::make_unique<feed_source>(*ctx.provider, rc.batch.micro_batch_size, rc.model.head, share);
  rr.parts.tied.assign(rc.stages, -1);
  for (std::uint32_t s = 0; s < rc.stages; ++s) {
    bert_optimizer_options o;
    o.participant = s;
    o.specs = bert::parameter_specs(rc.model, ctx.ranges[s]);
    // The tied word embedding: on the first stage, and on the last with a pretraining
    // head (a SQuAD head has no decoder, so no copy); the reducers sum it.
    for (std::size_t i = 0; i < o.specs.size(); ++i)
      if (o.specs[i].name == bert::word_embeddings_name()) rr.parts.tied[s] = static_cast<int>(i);
    o.optimizer = rc.optimizer;
    o.working = rc.working;
    o.decider = std::move(start.deciders[s]);
    if (static_cast<std::int64_t>(s) == rc.fail_stage) o.fail_step = rc.fail_optimizer_step;
    o.update_ns = &ctx.shared.optimizer_ns;
    if (zero) {
      o.zero_rank = static_cast<std::uint32_t>(ctx.rank);
      o.zero_ranks = static_cast<std::uint32_t>(rc.batch.data_parallel_size);
      o.peers = std::make_shared<net::communicator>(*transport, net::collective_options{}, actors::shard_channel(s));
    }
    if (start.resumed) {
      o.resume_masters = start.resumed->masters;
      o.resume_state = start.resumed->optimizer_states[s];
    }
    rr.shards.push_back(std::make_unique<bert_optimizer>(std::move(o)));
    rr.parts.stages.push_back(ctx.stages[s].get());
    rr.parts.optimizers.push_back(rr.shards.back().get());
  }
  rr.parts.source = rr.source.get();
  if (start.resumed) {
    try {
      for (std::uint32_t s = 0; s < rc.stages; ++s) rr.shards[s]->init(ctx.stages[s]->parameters());
    } catch (const std::exception& e) {
      return make_error(errc::format, "{}: optimizer state: {}", rc.checkpoint.dir, e.what());
    }
  }
  return rr;
}

int evaluate(run_context& ctx) {
  bert::bert_part whole = assemble_whole(ctx);
  const auto& d = ctx.rc.data;
  if (ctx.rc.model.head == bert::head_kind::pretraining) {
    if (d.eval_shards.empty()) return 0;
    auto shards = list_shards(d.eval_shards);
    if (!shards) {
      log_warn("evaluation skipped: {}", shards.err().message);
      return 0;
    }
    auto r = evaluate_pretraining(whole, *shards, ctx.rc.batch.micro_batch_size, d.eval_batches);
    if (!r) {
      log_error("evaluation failed: {}", r.err().message);
      return 1;
    }
    log_info("eval: {} held-out sequences: MLM accuracy {:.4f} (loss {:.4f}), NSP accuracy {:.4f} (loss {:.4f})",
             r->sequences, r->mlm_accuracy, r->mlm_loss, r->nsp_accuracy, r->nsp_loss);
    std::string summary = fmt::format("{{\"eval_sequences\":{},\"mlm_accuracy\":{:.6f},\"mlm_loss\":{:.6f},"
                                      "\"nsp_accuracy\":{:.6f},\"nsp_loss\":{:.6f}}}\n",
                                      r->sequences, r->mlm_accuracy, r->mlm_loss, r->nsp_accuracy, r->nsp_loss);
    (void)ckpt::write_file_atomic(ctx.rc.run_dir + "/eval.json", summary);
    fmt::print("{}", summary);
    return 0;
  }
  if (d.dev_file.empty()) return 0;
  squad_eval_settings s;
  s.dev_file = d.dev_file;
  s.predictions_path = ctx.rc.run_dir + "/predictions.json";
  s.batch_size = ctx.rc.batch.micro_batch_size;
  s.max_seq_length = static_cast<int>(d.max_seq_length);
  s.doc_stride = static_cast<int>(d.doc_stride);
  s.max_query_length = static_cast<int>(d.max_query_length);
  s.n_best_size = static_cast<int>(d.n_best_size);
  s.max_answer_length = static_cast<int>(d.max_answer_length);
  s.seed = ctx.rc.seed;
  auto r = evaluate_squad(whole, *ctx.tokenizer, s);
  if (!r) {
    log_error("evaluation failed: {}", r.err().message);
    return 1;
  }
  log_info("eval: wrote {}", s.predictions_path);
  log_info("eval: baseline first sentence: EM {:.2f} F1 {:.2f}; baseline random span: EM {:.2f} F1 {:.2f}",
           r->first_sentence.exact_match, r->first_sentence.f1, r->random_span.exact_match, r->random_span.f1);
  log_info("eval: model: EM {:.2f} F1 {:.2f} over {} questions", r->model.exact_match, r->model.f1, r->model.total);
  std::string line = data::squad_scores_json(r->model);
  (void)ckpt::write_file_atomic(ctx.rc.run_dir + "/eval.json", line + "\n");
  fmt::print("{}\n", line);
  return 0;
}

int fail(const error& e, int code) {
  fmt::print(stderr, "dsactor run: {}\n", e.message);
  return code;
}

// Exit code 2 for a configuration error, whenever it is found; 1 for anything else.
int fail(const error& e) { return fail(e, e.code == errc::config ? 2 : 1); }

} // namespace

int run_training(const run_request& req) {
  install_stop_handlers();
  run_context ctx;
  auto loaded = load_run_config(req.config_path, req.deepspeed_config);
  if (!loaded) return fail(loaded.err(), 2);
  ctx.cfg = std::move(*loaded);
  // Every problem of the config and the --set flags is reported in one run.
  config_problems problems;
  for (const auto& o : req.overrides)
    if (auto s = ctx.cfg.set_override(o); !s)
      problems.add(s.err());
  if (req.resume)
    if (auto s = ctx.cfg.set_override("checkpoint.load=\"latest\""); !s)
      problems.add(s.err());
  std::string run_dir = default_run_dir(req.config_path);
  if (req.resume && !ctx.cfg.table().at_path("run_dir").node()) {
    // Not finding the run to resume is reported with the config's problems.
    if (auto earlier = run_dir_to_resume(req.config_path)) run_dir = *earlier;
    else problems.add(earlier.err());
  }
  // Under dsactor launch this process is one rank of a job of WORLD_SIZE processes.
  auto launched = net::read_rendezvous_env();
  if (!launched) return fail(launched.err(), 2);
  const int processes = *launched ? (*launched)->world_size : 1;
  ctx.rc = read_run_config(ctx.cfg, run_dir, problems, processes);
  if (auto s = problems.to_status(); !s)
    return fail(s.err(), 2);
  auto& rc = ctx.rc;
  std::optional<job_membership> job;
  if (*launched) {
    auto joined = join_job(**launched, ctx.cfg);
    if (!joined) return fail(joined.err());
    job = std::move(*joined);
    ctx.rank = job->env.rank;
    // Every process writes into rank 0's run directory (a default name carries the time).
    auto dirs = job->client->allgather("run_dir", to_bytes(rc.run_dir));
    if (!dirs) return fail(dirs.err(), 1);
    const auto& first = dirs->front();
    rc.run_dir.assign(reinterpret_cast<const char*>(first.data()), first.size());
    if (!ctx.cfg.has("checkpoint.dir")) rc.checkpoint.dir = rc.run_dir + "/checkpoints";
  }
  const bool lead = ctx.rank == 0; // reports, saves, evaluates

  std::error_code ec;
  fs::create_directories(rc.run_dir, ec);
  if (ec) return fail(make_error(errc::io, "run_dir '{}': cannot create: {}", rc.run_dir, ec.message()), 1);
  const std::string log_name = lead ? "train.log" : fmt::format("train.rank{}.log", ctx.rank);
  if (!set_log_file(rc.run_dir + "/" + log_name))
    return fail(make_error(errc::io, "{}/{}: cannot open for writing", rc.run_dir, log_name), 1);
  struct log_file_closer {
    ~log_file_closer() { set_log_file(""); }
  } closer;
  const std::string effective = ctx.cfg.to_toml();
  if (lead)
    if (auto w = ckpt::write_file_atomic(rc.run_dir + "/config.toml", effective + "\n"); !w) return fail(w.err(), 1);
  log_info("dsactor run {} -> {}{}\neffective config:\n{}", rc.config_path, rc.run_dir,
           job ? fmt::format(" as rank {} of {} processes", ctx.rank, job->env.world_size) : std::string(), effective);

  // Rank 0 prepares the data (data.prepare) before the others look at it.
  if (job && !lead)
    if (auto s = job->client->barrier("data"); !s) return fail(s.err(), 1);
  auto v = load_vocab(ctx);
  if (!v) return fail(v.err());
  if (job && lead)
    if (auto s = job->client->barrier("data"); !s) return fail(s.err(), 1);
  tok::tokenizer_options to;
  if (!rc.data.lower_case) to.case_mode = tok::casing::keep;
  if (*v) ctx.tokenizer = std::make_unique<tok::bert_tokenizer>(std::move(**v), to);
  if (auto s = make_provider(ctx); !s) return fail(s.err());
  log_info("model: {}; precision {}; batch {} = micro {} x accumulation {} x {} rank(s)", bert::describe(rc.model),
           precision_name(rc.working), rc.batch.train_batch_size, rc.batch.micro_batch_size,
           rc.batch.gradient_accumulation, rc.batch.data_parallel_size);
  std::int64_t total_steps = rc.train_steps;
  if (total_steps == 0)
    total_steps = static_cast<std::int64_t>(std::ceil(rc.epochs * static_cast<double>(ctx.provider->rows_per_epoch()) /
                                                      static_cast<double>(rc.batch.train_batch_size)));
  ctx.last_step = static_cast<std::uint32_t>(std::max<std::int64_t>(total_steps, 1) - 1);
  auto start0 = prepare_rank(ctx);
  if (!start0) return fail(start0.err());
  std::vector<rank_start> starts;
  starts.push_back(std::move(*start0));
  // Data-parallel ranks 1..R-1 of this process: the same config, each with its own
  // data provider (a copy at rank 0's position), stages, deciders and restored state.
  const int R = static_cast<int>(rc.ranks);
  std::vector<std::unique_ptr<run_context>> replicas;
  for (int r = 1; r < R; ++r) {
    auto c = std::make_unique<run_context>();
    c->rc = ctx.rc;
    c->cfg = ctx.cfg;
    c->tokenizer = ctx.tokenizer;
    c->provider = ctx.provider->clone();
    c->last_step = ctx.last_step;
    c->rank = ctx.rank + r;
    auto st = prepare_rank(*c);
    if (!st) return fail(st.err());
    starts.push_back(std::move(*st));
    replicas.push_back(std::move(c));
  }
  auto context_of = [&](int r) -> run_context& { return r == 0 ? ctx : *replicas[static_cast<std::size_t>(r - 1)]; };

  int status_code = 0;
  if (ctx.first_step <= ctx.last_step) {
    // Rows are numbered by completed steps: a resumed run keeps rows 1..first_step. Rank 0
    // alone writes them (and the progress, and checkpoints).
    std::optional<metrics_writer> metrics;
    if (lead) {
      auto m = starts[0].resumed ? metrics_writer::open_resumed(rc.run_dir, ctx.first_step)
                                 : metrics_writer::open(rc.run_dir);
      if (!m) return fail(m.err(), 1);
      metrics.emplace(std::move(*m));
    }
    progress bar(ctx.first_step, ctx.last_step + 1, lead ? rc.steps_per_print : 0, progress::detect_style());
    const auto M = static_cast<std::uint32_t>(rc.batch.gradient_accumulation);
    const bool global = rc.gradient_clipping > 0 || rc.working == precision::f16;
    log_info("optimizer updates: {}", global ? "after the reducers exchanged every stage's gradient norm "
                                               "(gradient clipping or loss scaling need it)"
                                             : "each stage's as soon as its gradients are reduced (no clipping, "
                                               "no loss scaling)");
    const int world = static_cast<int>(rc.batch.data_parallel_size);
    if (world > 1)
      log_info("data parallel: {} ranks{}; gradients summed over them in buckets of up to {} elements, "
               "{} ({})",
               world, job ? " (one per process)" : " in this process", rc.reduce_bucket_elements,
               rc.overlap_comm ? "each started as backward finishes it (overlap_comm)" : "after the step's backward",
               rc.zero_stage >= 1 ? "ZeRO stage 1: each rank holds the optimizer state of 1/" + std::to_string(world) +
                                        " of the parameters"
                                  : "ZeRO stage 0: every rank holds the whole optimizer state");
    std::unique_ptr<net::local_group> group;
    if (R > 1) group = std::make_unique<net::local_group>(R);
    // Rank r's transport to the others: UCX between processes, or the in-process group.
    auto transport_of = [&](int r) -> net::transport* {
      if (job) return job->transport.get();
      return group ? &group->at(r) : nullptr;
    };
    // ZeRO stage 1: each rank's shards hold 1/world of the optimizer state.
    const bool zero = rc.zero_stage >= 1 && world > 1;
    std::vector<rank_run> runs;
    for (int r = 0; r < R; ++r) {
      auto rr = make_rank_run(context_of(r), starts[static_cast<std::size_t>(r)], transport_of(r));
      if (!rr) return fail(rr.err(), 1);
      runs.push_back(std::move(*rr));
    }
    std::vector<const bert_optimizer*> shard_views;
    for (const auto& shard : runs[0].shards) shard_views.push_back(shard.get());
    std::optional<step_reporter> reporter;
    if (lead) reporter.emplace(ctx, *metrics, bar, shard_views);
    actors::run_options ro;
    ro.pipeline.stages = rc.stages;
    ro.pipeline.micro_batches = M;
    ro.pipeline.steps = ctx.last_step - ctx.first_step + 1;
    ro.pipeline.schedule = rc.schedule == "gpipe" ? actors::schedule_kind::gpipe : actors::schedule_kind::one_f_one_b;
    ro.pipeline.totals = global ? actors::grad_scope::global : actors::grad_scope::per_stage;
    ro.first_step = ctx.first_step;
    if (starts[0].resumed) ro.optimizers = actors::optimizer_start::already_loaded;
    // The shards wait for each on_step to return before their next update (step_hooks.hpp);
    // with several ranks the coordinators stop when any rank is asked to.
    ro.stop_after = [&](std::uint32_t k) { return stop_requested() && k != ctx.last_step; };
    ro.watchdog = std::chrono::seconds(rc.watchdog_seconds);
    ro.run_dir = rc.run_dir;
    // comms_logger: this process's first rank's collectives (every rank issues the same ones).
    net::comms_logger comms(rc.comms_logger, world);
    auto options_of = [&](int r) {
      actors::run_options o = ro;
      const int global = ctx.rank + r;
      if (global == 0) o.on_step = [&](const actors::step_summary& summary) { reporter->on_step(summary); };
      if (world > 1)
        o.dp = {global, world, transport_of(r), rc.reduce_bucket_elements, rc.overlap_comm, r == 0 ? &comms : nullptr};
      // With ZeRO a checkpoint gathers the optimizer state from every rank's shards:
      // the ranks that do not write it take part in the same steps.
      if (global != 0 && zero)
        o.on_step = [&, r](const actors::step_summary& summary) {
          if (checkpoint_due(context_of(r), summary.step)) contribute_checkpoint(runs[static_cast<std::size_t>(r)], summary.step);
        };
      return o;
    };
    std::vector<actors::run_result> results(static_cast<std::size_t>(R));
    std::vector<std::thread> threads;
    for (int r = 1; r < R; ++r)
      threads.emplace_back([&, r] {
        results[static_cast<std::size_t>(r)] = actors::run_pipeline(options_of(r), runs[static_cast<std::size_t>(r)].parts);
      });
    results[0] = actors::run_pipeline(options_of(0), runs[0].parts);
    for (auto& t : threads) t.join();
    bar.finish();
    const actors::run_result& result = results[0];
    if (comms.enabled()) {
      const std::string table = comms.summary();
      log_info("comms_logger summary (rank {} of {}; nccl-tests bandwidths):\n{}", ctx.rank, world,
               table.empty() ? std::string("no collectives (one rank)") : table);
    }
    std::string errors;
    for (int r = 0; r < R; ++r)
      if (!results[static_cast<std::size_t>(r)].ok)
        errors += (errors.empty() ? "" : "\n") + results[static_cast<std::size_t>(r)].error;
    if (!errors.empty()) return fail(make_error(errc::runtime, "{}", errors), 1);
    // The final checkpoint (or the one a signal asked for): the shards hold that step's state.
    const std::int64_t done = static_cast<std::int64_t>(ctx.first_step) + result.steps_completed - 1;
    // Every rank agrees that the run ended early (the coordinators stop together), so
    // every rank takes the same decision even when the signal reached only some.
    const bool early = ctx.first_step + result.steps_completed <= ctx.last_step;
    const bool stopped = stop_requested() || early; // also when the signal came during the last step
    // With several ranks the decision must be the same everywhere (a ZeRO checkpoint is
    // a collective): only what the ranks agreed on counts, not a signal one process got
    // during the last step.
    const bool final_save =
        done >= 0 && (rc.checkpoint.save_final || early || (world == 1 && stop_requested()));
    // With ZeRO the other ranks' shards take part in gathering the state (their own threads).
    std::vector<std::thread> contributors;
    std::vector<std::string> contribution_errors(static_cast<std::size_t>(R));
    for (int r = 0; r < R; ++r) {
      rank_run& run = runs[static_cast<std::size_t>(r)];
      if (ctx.rank + r == 0 || !final_save || !zero || done <= run.last_contributed)
        continue;
      contributors.emplace_back([&, r] {
        try {
          contribute_checkpoint(runs[static_cast<std::size_t>(r)], static_cast<std::uint32_t>(done));
        } catch (const std::exception& e) {
          contribution_errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    }
    std::optional<error> save_error;
    if (lead && final_save && done > reporter->last_saved()) {
      try {
        reporter->save(static_cast<std::uint32_t>(done), result.data_positions.back());
      } catch (const std::exception& e) {
        save_error = make_error(errc::io, "{}", e.what());
      }
    }
    // Contributors still waiting in a gather rank 0 never entered: wake them.
    if (save_error && !contributors.empty())
      if (auto* t = transport_of(0)) t->abort(*save_error);
    for (auto& t : contributors) t.join();
    if (save_error) return fail(*save_error, 1);
    for (const auto& e : contribution_errors)
      if (!e.empty()) return fail(make_error(errc::runtime, "{}", e), 1);
    // The other processes need nothing more from this one: leave the job cleanly.
    if (job)
      if (auto s = job->client->leave(); !s) log_warn("leaving the job's rendezvous: {}", s.err().message);
    if (lead && !req.trace_chrome.empty()) { // rank 0's trace (the others' are trace.rank<r>.dsat)
      if (auto w = actors::write_chrome_trace(req.trace_chrome, result.trace); !w) return fail(w.err(), 1);
      log_info("wrote Chrome trace {}", req.trace_chrome);
    }
    if (rc.stages > 1 || M > 1) {
      double bubble = actors::theoretical_bubble(rc.stages, M);
      for (const auto& idle : actors::stage_idle_fractions(result.trace, rc.stages, M))
        log_info("stage {}: idle {:.1f}% of the run (1F1B bubble (S-1)/(M+S-1) = {:.1f}%)", idle.stage,
                 100 * idle.idle_fraction, 100 * bubble);
    }
    for (const auto& o : actors::allreduce_overlap(result.trace, rc.stages))
      log_info("stage {}: gradient allreduce {:.3f} s, {:.1f}% of it during the stage's backward{}", o.stage,
               o.allreduce_s, o.allreduce_s > 0 ? 100 * o.overlapped_s / o.allreduce_s : 0.0,
               rc.overlap_comm ? "" : " (overlap_comm is off)");
    log_info("training done: last loss {:.4f}, {} step(s) skipped", result.losses.empty() ? 0.0 : result.losses.back(),
             runs[0].shards.front()->decider().skipped());
    if (lead && !result.trace_path.empty())
      log_info("actor trace: {} (summarise it: dsactor trace {} summary)", result.trace_path, rc.run_dir);
    if (stopped) {
      log_info("stopped by signal after step {}; resume with: dsactor run {} --resume", done + 1, req.config_path);
      return 130;
    }
  } else {
    log_info("nothing to train: the checkpoint is at step {} of {}", ctx.first_step, ctx.last_step + 1);
  }
  if (lead) status_code = evaluate(ctx);
  return status_code;
}

} // namespace dsa::train
