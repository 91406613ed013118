// Setting up one rank of a run; see run_setup.hpp (the final evaluation: run_evaluate.cpp).
#include "actors/train/run/run_setup.hpp"
#include "actors/train/run/run_restore.hpp"

#include "actors/train/shard/partition_resume.hpp"

#include "actors/train/shard/shard_options.hpp"
#include "actors/train/stage/model_stage.hpp"
#include "actors/train/data/data_prepare.hpp"
#include "actors/train/eval/evaluation.hpp"
#include "actors/train/memory/memory_accounting.hpp"
#include "actors/train/memory/memory_plan.hpp"
#include "actors/train/config/layer_partition.hpp"
#include "core/file_backed.hpp"
#include "core/log.hpp"
#include "io/aio/swap_store.hpp"
#include "io/ckpt/atomic_file.hpp"
#include "io/ckpt/safetensors.hpp"
#include "io/data/pretrain_shard.hpp"
#include "io/data/squad_dataset.hpp"
#include "actors/data_parallel.hpp"
#include "io/net/communicator.hpp"
#include "models/bert/bert_state.hpp"
#include "optim/lr_schedule.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <set>
#include <stdexcept>

namespace dsa::train {

expected<std::optional<tok::vocab>> load_vocab(run_inputs& in) {
  if (in.rc.data.prepare) DSA_TRY(prepare_pretraining_data(*in.rc.data.prepare, in.rc.data.vocab));
  if (in.rc.data.prepare_qa) DSA_TRY(prepare_qa_data(*in.rc.data.prepare_qa));
  if (in.rc.data.vocab.empty()) return std::optional<tok::vocab>();
  DSA_ASSIGN_OR_RETURN(auto v, tok::vocab::load(in.rc.data.vocab));
  if (!in.cfg.table().at_path("model.vocab_size").node()) in.rc.model.vocab_size = v.size();
  if (v.size() > in.rc.model.vocab_size)
    return in.cfg.key_error("model.vocab_size", fmt::format("{} is smaller than the vocabulary {} ({} tokens)",
                                                             in.rc.model.vocab_size, in.rc.data.vocab, v.size()));
  return std::optional<tok::vocab>(std::move(v));
}

namespace {

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
} // namespace

status make_provider(run_inputs& in, rank_model& m) {
  const auto& d = in.rc.data;
  if (in.rc.model.head == bert::head_kind::pretraining) {
    DSA_ASSIGN_OR_RETURN(auto shards, list_shards(d.train_shards));
    data::shard_reader_options o;
    o.shuffle_buffer = d.shuffle_buffer;
    o.seed = in.rc.seed;
    if (d.dynamic_masking) {
      o.masking = data::masking_source::dynamic;
      o.vocab = data::masking_vocab::from(in.tokenizer->vocabulary());
    }
    DSA_ASSIGN_OR_RETURN(auto reader, data::shard_reader::open(shards, o));
    if (in.tokenizer)
      DSA_TRY(data::check_shard_vocab(reader.layout(), shards.front(), in.tokenizer->vocabulary(), d.vocab));
    else if (!in.cfg.table().at_path("model.vocab_size").node())
      in.rc.model.vocab_size = reader.layout().vocab_size;
    DSA_TRY(check_eval_shards(d, reader.layout(), shards.front()));
    if (reader.layout().vocab_size > in.rc.model.vocab_size || reader.layout().seq_length > in.rc.model.max_position_embeddings)
      return make_error(errc::config, "{}: shards (vocab {}, seq {}) do not fit the model (vocab {}, positions {})",
                        d.train_shards, reader.layout().vocab_size, reader.layout().seq_length, in.rc.model.vocab_size,
                        in.rc.model.max_position_embeddings);
    if (in.rank == 0)
      log_info("data: {} pre-training shard(s), {} sequences of {} tokens per epoch", shards.size(),
             reader.instances_per_epoch(), reader.layout().seq_length);
    m.seq_length = reader.layout().seq_length;
    m.provider = std::make_unique<pretrain_provider>(std::move(reader));
    return {};
  }
  DSA_ASSIGN_OR_RETURN(auto dataset, data::load_squad(d.train_file));
  auto examples = data::squad_read_examples(dataset, data::squad_mode::training);
  data::squad_feature_options fo;
  fo.max_seq_length = static_cast<int>(d.max_seq_length);
  fo.doc_stride = static_cast<int>(d.doc_stride);
  fo.max_query_length = static_cast<int>(d.max_query_length);
  fo.mode = data::squad_mode::training;
  DSA_ASSIGN_OR_RETURN(auto features, data::squad_convert_examples(examples.examples, *in.tokenizer, fo));
  for (auto& f : features) f.tokens.clear(); // training needs ids only
  log_info("data: {}: {} SQuAD questions -> {} training features; {} answers found away from answer_start "
           "(labelled where found); {} questions skipped ({} answers not in the context, {} not recoverable from "
           "the whitespace words)",
           d.train_file, examples.examples.size() + static_cast<std::size_t>(examples.skipped), features.size(),
           examples.moved, examples.skipped, examples.not_found, examples.skipped - examples.not_found);
  if (features.empty()) return make_error(errc::config, "{}: no training features", d.train_file);
  m.seq_length = d.max_seq_length;
  m.provider = std::make_unique<squad_provider>(std::move(features), in.rc.seed);
  return {};
}

namespace {

// A value_maker carving the range's tensors out of one file of zeros in offload_param's
// nvme_path (unlinked once mapped), each at a page boundary.
expected<bert::bert_parameters::value_maker> weights_in_file(const run_config& rc, const bert::bert_range& range,
                                                               std::uint32_t s) {
  const std::int64_t page = 4096;
  const auto w = static_cast<std::int64_t>(dtype_size(working_dtype(rc.working)));
  std::int64_t bytes = 0;
  for (const auto& spec : bert::parameter_specs(rc.model, range)) bytes += (shape_numel(spec.shape) * w + page - 1) / page * page;
  std::error_code ec;
  std::filesystem::create_directories(rc.offload.param.nvme_path, ec);
  const std::string path =
      fmt::format("{}/dsactor-stage{}-weights-{}.swp", rc.offload.param.nvme_path, s, static_cast<long>(::getpid()));
  DSA_ASSIGN_OR_RETURN(tensor arena, file_backed_zeros(path, bytes, dtype::u8));
  auto at = std::make_shared<std::int64_t>(0);
  return bert::bert_parameters::value_maker([arena, at, page](const bert::param_spec& spec, dtype type) {
    const std::int64_t n = shape_numel(spec.shape) * static_cast<std::int64_t>(dtype_size(type));
    DSA_CHECK(*at + n <= arena.numel(), "the stage's weights file is {} bytes, {} more asked at {}", arena.numel(), n, *at);
    tensor view = tensor::from_storage(arena.storage_ptr(), static_cast<std::size_t>(*at), spec.shape, type);
    *at += (n + page - 1) / page * page;
    return view;
  });
}

status make_stages(const run_inputs& in, rank_model& m) {
  DSA_ASSIGN_OR_RETURN(m.ranges, partition_layers(in.rc.model, in.rc.stages, in.rc.partition));
  ckpt::named_tensors init;
  if (!in.rc.init_checkpoint.empty()) {
    DSA_ASSIGN_OR_RETURN(std::string file, weights_file_of(in.rc.init_checkpoint));
    // Under a budget mapped, not read: each stage's load pages a tensor out once copied.
    DSA_ASSIGN_OR_RETURN(auto f, in.rc.host_memory > 0 ? ckpt::map_safetensors(file) : ckpt::read_safetensors(file));
    init = std::move(f.tensors);
    if (in.rank == 0) log_info("initial weights from {}", file);
  }
  for (std::uint32_t s = 0; s < in.rc.stages; ++s) {
    if (!in.local(s)) { // another process runs it (stages across processes)
      m.stages.emplace_back();
      continue;
    }
    const auto M = static_cast<std::uint32_t>(in.rc.batch.gradient_accumulation);
    const auto R = static_cast<std::uint32_t>(in.rc.batch.data_parallel_size);
    stage_options o;
    o.model = in.rc.model;
    o.range = m.ranges[s];
    o.micro_batches = M * R;
    o.micro_batch_offset = static_cast<std::uint32_t>(in.rank) * M;
    o.working = in.rc.working;
    o.seed = in.rc.seed;
    o.whole_gradients = !in.rc.gradients_partitioned();
    if (static_cast<std::int64_t>(s) == in.rc.fail_stage) o.fail_step = in.rc.fail_step;
    o.overflow_step = in.rc.overflow_step;
    o.device_index = in.device.index;
    o.output_leaves_process = s + 1 < in.rc.stages && !in.local(s + 1);
    o.grad_in_leaves_process = s > 0 && !in.local(s - 1);
    o.deterministic = in.rc.deterministic;
    const auto specs = bert::parameter_specs(in.rc.model, o.range);
    o.planned_device_bytes = cuda_model_state_bytes(in.rc, specs);
    o.zero3_device_window = static_cast<std::size_t>(cuda_zero3_window(in.rc, specs));
    if (builds_weights_in_file(in.rc) && in.device.device == stage_device::cpu) {
      DSA_ASSIGN_OR_RETURN(o.make_value, weights_in_file(in.rc, o.range, s));
    }
    auto stage = make_stage(in.device.device, o, m.shared);
    stage->named_parameters().init(in.rc.seed);
    if (!init.empty()) {
      bert::load_options lo;
      lo.head = bert::missing_head::keep_current;
      auto loaded = bert::load_state(stage->named_parameters(), init, lo);
      if (!loaded) return make_error(errc::format, "init_checkpoint {}: {}", in.rc.init_checkpoint, loaded.err().message);
    }
    const auto& params = stage->named_parameters();
    if (in.rank == 0)
      log_info("stage {}: model states per rank: {}{}; DeepSpeed's mixed-precision accounting for ZeRO stage {} on {} "
               "rank(s): {:.2f} MiB",
               s,
               expected_model_states(params.count(), in.rc.working, run_zero_sizes(in.rc, m.ranges, s)).describe(),
               run_zero_sizes(in.rc, m.ranges, s)
                   ? fmt::format(" (ZeRO stage {}: {} of 1/{} of the stage{})", in.rc.zero_stage,
                                 in.rc.zero_stage >= 3   ? "working weights, gradients, masters and moments"
                                 : in.rc.zero_stage >= 2 ? "gradients, masters and moments"
                                                          : "masters and moments",
                                 in.rc.batch.data_parallel_size,
                                 in.rc.offload.swaps() ? "; masters and moments on NVMe" : "")
                   : fmt::format(" ({} bytes per parameter)", expected_model_states(1, in.rc.working).total()),
               in.rc.zero_stage, in.rc.batch.data_parallel_size,
               deepspeed_model_states(params.count(), in.rc.zero_stage,
                                      static_cast<int>(in.rc.batch.data_parallel_size)) /
                   (1 << 20));
    if (in.rank == 0)
      log_info("stage {}: {} ({} parameters, {:.2f} MiB of {} working weights)", s,
             m.ranges[s].to_string(), params.count(),
             static_cast<double>(params.value_bytes()) / (1 << 20),
             dtype_name(params.value_type()));
    m.stages.push_back(std::move(stage));
  }
  return {};
}

// One step_decider per shard, all alike (fed identical totals, they decide alike).
expected<std::vector<std::unique_ptr<step_decider>>> make_deciders(const run_inputs& in) {
  step_decider_options o;
  o.base_lr = in.rc.optimizer.lr;
  o.clip = in.rc.gradient_clipping;
  o.scaling = in.rc.working == precision::f16;
  o.scaler = in.rc.scaler;
  std::vector<std::unique_ptr<step_decider>> out;
  for (std::uint32_t s = 0; s < in.rc.stages; ++s) {
    o.rank = static_cast<int>(s);
    std::unique_ptr<optim::lr_schedule> schedule;
    if (in.rc.has_scheduler) {
      DSA_ASSIGN_OR_RETURN(schedule, optim::make_lr_schedule(in.cfg, in.rc.optimizer.lr));
    }
    out.push_back(std::make_unique<step_decider>(o, std::move(schedule)));
  }
  return out;
}

} // namespace


expected<rank_start> prepare_rank(run_inputs& in, rank_model& m) {
  DSA_TRY(make_stages(in, m));
  rank_start st;
  DSA_ASSIGN_OR_RETURN(st.deciders, make_deciders(in));
  if (!in.rc.checkpoint.load.empty()) {
    DSA_ASSIGN_OR_RETURN(auto r, restore(in, m, in.rc.checkpoint.load));
    st.resumed = std::move(r);
    for (auto& d : st.deciders)
      d->restore(st.resumed->progress.schedule_iteration, st.resumed->progress.scaler,
                 st.resumed->progress.skipped_steps);
  }
  for (std::uint32_t s = 0; s < in.rc.stages; ++s)
    if (m.stages[s]) m.stages[s]->loss_scale() = st.deciders[s]->loss_scale();
  return st;
}


void contribute_checkpoint(rank_run& run, const std::string& root, std::uint32_t step) {
  for (auto& shard : run.shards) {
    if (!shard) continue; // another process's stage
    if (shard->saves_errors()) (void)shard->stage_errors(root, std::uint64_t{step} + 1);
    if (!shard->per_rank_checkpoint()) continue;
    (void)shard->gathered_masters();
    (void)shard->stage_partition(root, std::uint64_t{step} + 1);
  }
  run.last_contributed = step;
}

namespace {

// Where a rank's swapped state goes: the NVMe engine actor's ports for the optimizer
// state and for the ZeRO-3 weight partitions (null without NVMe offload).
struct swap_ports {
  std::shared_ptr<aio::submitter> swap, param;
  swap_area* param_area = nullptr;
  swap_area* area = nullptr; // the optimizer's (limits.gradient_partition = "nvme" puts the gradients there)
};

// The rank's swap areas for offload_optimizer and offload_param on NVMe, logged by rank
// 0, and its NVMe engine actor over their engines.
expected<swap_ports> open_swap_areas(const run_inputs& in, rank_run& rr) {
  const auto& rc = in.rc;
  const auto& off = rc.offload;
  // A swap folder per rank; with stages across processes per process (processes with the
  // same data rank run other stages, on the same disk perhaps).
  const bool per_process = rc.stages_across_processes();
  const int ranks = per_process ? rc.processes : static_cast<int>(rc.batch.data_parallel_size);
  const int area_rank = per_process ? in.process : in.rank;
  swap_ports ports;
  if (off.swaps()) {
    DSA_ASSIGN_OR_RETURN(rr.swap, swap_area::open(off, rc.run_dir, area_rank, ranks));
    if (in.rank == 0 && in.process == 0)
      log_info("ZeRO-Infinity: optimizer state (fp32 masters and moments) swapped to {}/rank<r>, in sub-groups of up to "
               "{} elements through {} buffers per stage (pipeline_read {}, pipeline_write {}; [aio] {})",
               off.nvme_path + "/" + swap_job_name(rc.run_dir), off.sub_group_size,
               aio::swap_buffers_allocated(static_cast<std::size_t>(off.buffer_count)), off.pipeline_read, off.pipeline_write,
               off.aio.summary());
  } else if (off.device == offload_device::cpu && in.rank == 0) {
    log_info("offload_optimizer.device = \"cpu\": on a CPU rank the optimizer state is in host memory already and is "
             "stepped by the CPU kernels; nothing changes");
  }
  if (off.param.swaps()) {
    if (rr.swap && off.param.nvme_path == off.nvme_path) {
      ports.param_area = rr.swap.get();
    } else {
      offload_settings ps = off;
      ps.nvme_path = off.param.nvme_path;
      DSA_ASSIGN_OR_RETURN(rr.param_swap, swap_area::open(ps, rc.run_dir, area_rank, ranks));
      ports.param_area = rr.param_swap.get();
    }
    if (in.rank == 0)
      log_info("ZeRO-Infinity: each rank's partition of the working weights beyond its first {} elements "
               "(offload_param.max_in_cpu) swapped to {}/rank<r>, moved through {} buffers of up to {} elements",
               off.param.max_in_cpu, off.param.nvme_path + "/" + swap_job_name(rc.run_dir), off.param.buffer_count,
               off.param.buffer_size);
  } else if (off.param.device == offload_device::cpu && in.rank == 0 && rc.backend == "cuda" && rc.zero_stage >= 3) {
    if (rc.zero_partitions())
      log_info("offload_param.device = \"cpu\": each rank's partition of the working weights stays in host memory; "
               "the CUDA stage gathers each part's weights onto the GPU as it runs it and frees them after");
    else
      log_info("offload_param.device = \"cpu\" with stage 3 on one rank: nothing to partition, so stage 3 runs as "
               "stage 0 and the weights stay whole on the GPU (offload_param.device = \"nvme\" moves them off it)");
  } else if (off.param.device == offload_device::cpu && in.rank == 0) {
    log_info("offload_param.device = \"cpu\": on a CPU rank the working weights (each rank's partition; on one rank "
             "the whole stage, stage 3 running as stage 0) are in host memory already; nothing changes (\"nvme\" moves "
             "them)");
  }
  // The rank's NVMe engine actor: the stores submit to it, it starts requests on the areas' engines.
  if (rr.swap || rr.param_swap) {
    actors::nvme_engine_options no;
    for (const swap_area* area : {rr.swap.get(), rr.param_swap.get()})
      if (area) no.engines.push_back({area->engine(), actors::io_credits_of(off.aio), area->dir()});
    DSA_ASSIGN_OR_RETURN(rr.nvme, actors::nvme_engine_service::start(std::move(no)));
    if (rr.swap) ports.swap = rr.nvme->port(0);
    ports.area = rr.swap.get();
    if (rr.param_swap) ports.param = rr.nvme->port(rr.swap ? 1 : 0);
    else if (ports.param_area) ports.param = ports.swap;
  }
  return ports;
}

// ZeRO stages 1 to 3: stage s's shard holds this rank's partition; with stage 2 or 3 the
// gradients are summed into partitions, and with stage 3 the stage gathers its weights
// through a parameter fetcher (from NVMe with offload_param).
status add_zero_partition(const run_inputs& in, rank_model& m, std::uint32_t s, net::transport* transport, net::comms_logger* comms,
                          const swap_ports& ports, const std::vector<int>& tied, shard_options& o) {
  const auto& rc = in.rc;
  o.zero_rank = static_cast<std::uint32_t>(in.rank);
  o.zero_ranks = static_cast<std::uint32_t>(rc.batch.data_parallel_size);
  o.peers = std::make_shared<net::communicator>(*transport, net::collective_options{}, actors::shard_channel(s));
  o.logger = comms;
  o.partition_gradients = rc.zero_stage >= 2;
  o.partition_parameters = rc.zero_stage >= 3;
  // ZeRO-3, and ZeRO-2 on one pipeline stage: each micro-batch's gradients summed into
  // the partitions (with several stages the reducers add the tied embedding's gradient
  // whole, so the stages keep whole accumulators).
  const bool grads_partitioned = rc.gradients_partitioned();
  std::optional<optim::flat_layout> layout;
  std::shared_ptr<partition_grads> grads;
  if (grads_partitioned) {
    DSA_ASSIGN_OR_RETURN(layout, stage_flat_layout(o.specs, o.zero_ranks));
    tensor accumulator; // undefined: in memory
    if (rc.grads_on_nvme) {
      DSA_CHECK(ports.area, "limits.gradient_partition = \"nvme\" without the optimizer's swap folder");
      DSA_ASSIGN_OR_RETURN(accumulator, file_backed_zeros(fmt::format("{}/stage{}.grads.swp", ports.area->dir(), s),
                                                          layout->partition_numel(), dtype::f32));
    }
    grads = std::make_shared<partition_grads>(
        *layout, o.zero_rank, working_dtype(rc.working),
        std::make_shared<net::communicator>(*transport, net::collective_options{}, actors::grad_channel(s)),
        rc.reduce_bucket_elements, comms, fmt::format("gradient partition {} of rank {}", s, in.rank),
        std::move(accumulator));
  }
  if (grads) o.shared_gradients = grads->partition();
  if (grads_partitioned && !o.partition_parameters) m.stages[s]->enable_partitioned_grads(std::move(grads));
  if (o.partition_parameters) {
    // ZeRO-3: the stage keeps its partition of the weights and gathers each part's as it runs it.
    model_stage& stage = *m.stages[s];
    fetch_settings fs;
    fs.persistence_threshold = rc.stage3_persistence;
    fs.prefetch_elements = rc.stage3_prefetch;
    fs.max_live_elements = rc.stage3_max_live;
    fs.logger = comms;
    fs.caller = fmt::format("fetcher {} of rank {}", s, in.rank);
    std::unique_ptr<param_store> store; // null: in memory
    if (ports.param_area) {
      const auto& param = rc.offload.param;
      nvme_param_options po{ports.param, fmt::format("{}/stage{}.params.swp", ports.param_area->dir(), s),
                             param.max_in_cpu, param.buffer_size, param.buffer_count};
      DSA_ASSIGN_OR_RETURN(store, nvme_param_store(layout->partition_numel(), working_dtype(rc.working), po));
    }
    o.fetcher = std::make_shared<param_fetcher>(
        std::move(*layout), o.zero_rank, working_dtype(rc.working),
        std::make_shared<net::communicator>(*transport, net::collective_options{}, actors::fetch_channel(s)),
        stage.fetch_parts(), stage.fetch_sequence(), static_cast<std::uint32_t>(rc.batch.gradient_accumulation), fs,
        std::move(store));
    stage.enable_zero3(o.fetcher, std::move(grads));
  }
  // The tied embedding's gradient stays whole where the reducers add it (memory_accounting.hpp).
  if (tied_exchanged(rc, m.ranges)) o.whole_gradient = tied[s];
  return {};
}

// What a checkpoint restored gives stage s's shard: its partitions' ranges read from the
// checkpoint's files (partitioned runs), or the whole masters and optimizer state.
void add_resumed_state(const run_config& rc, std::uint32_t s, rank_start& start, shard_options& o) {
  if (!start.resumed) return;
  o.resume_errors = start.resumed->error_states.at(s);
  o.resume_lamb = std::move(start.resumed->lamb_states.at(s)); // the shard's only copy
  if (partitioned(rc) && start.resumed->repartitioned) {
    std::set<std::string> names;
    for (const auto& spec : o.specs) names.insert(spec.name);
    o.resume_partitions = [dir = start.resumed->dir, manifest = start.resumed->manifest,
                           saved = start.resumed->progress.stages,
                           names = std::move(names)]() -> expected<std::vector<optim::saved_partition>> {
      DSA_ASSIGN_OR_RETURN(auto sources, open_repartitioned_sources(dir, manifest, saved, names));
      return std::move(sources.parts);
    };
  } else if (partitioned(rc)) {
    o.resume_partitions = [dir = start.resumed->dir, manifest = start.resumed->manifest,
                           s]() -> expected<std::vector<optim::saved_partition>> {
      DSA_ASSIGN_OR_RETURN(auto sources, open_stage_sources(dir, manifest, s));
      return std::move(sources.parts);
    };
  } else {
    o.resume_masters = start.resumed->masters;
    o.resume_state = start.resumed->optimizer_states[s];
  }
}

} // namespace

expected<rank_run> make_rank_run(const run_inputs& in, rank_model& m, rank_start& start, net::transport* transport,
                                 net::comms_logger* comms) {
  const auto& rc = in.rc;
  rank_run rr;
  const feed_share share{in.rank, static_cast<int>(rc.batch.data_parallel_size),
                         static_cast<std::uint32_t>(rc.batch.gradient_accumulation)};
  rr.source = std::make_unique<feed_source>(*m.provider, rc.batch.micro_batch_size, rc.model.head, share);
  rr.parts.tied.assign(rc.stages, -1);
  DSA_ASSIGN_OR_RETURN(const swap_ports ports, open_swap_areas(in, rr));
  for (std::uint32_t s = 0; s < rc.stages; ++s) {
    shard_options o;
    o.participant = s;
    o.specs = bert::parameter_specs(rc.model, m.ranges[s]);
    // The tied word embedding: on the first stage, and on the last with a pretraining
    // head (a SQuAD head has no decoder, so no copy); the reducers sum it.
    for (std::size_t i = 0; i < o.specs.size(); ++i)
      if (o.specs[i].name == bert::word_embeddings_name()) rr.parts.tied[s] = static_cast<int>(i);
    o.exchanges_tied = rr.parts.tied[s] >= 0 && tied_exchanged(rc, m.ranges);
    if (!in.local(s)) { // another process's stage: the runtime sends to it through the pipeline's link
      rr.shards.emplace_back();
      rr.parts.stages.push_back(nullptr);
      rr.parts.optimizers.push_back(nullptr);
      continue;
    }
    o.optimizer = rc.optimizer;
    o.working = rc.working;
    o.decider = std::move(start.deciders[s]);
    if (static_cast<std::int64_t>(s) == rc.fail_stage) o.fail_step = rc.fail_optimizer_step;
    o.update_ns = &m.shared.optimizer_ns;
    if (rc.optimizer.compressed()) {
      // 1-bit Adam, 0/1 Adam, 1-bit LAMB: their compressed exchanges on the shard's channel.
      if (rc.batch.data_parallel_size > 1 && !rc.zero_partitions()) // with ZeRO, the partition's channel
        o.peers = std::make_shared<net::communicator>(*transport, net::collective_options{}, actors::shard_channel(s));
      o.logger = comms;
      o.mask_positions_from = m.seq_length;
    }
    if (rc.zero_partitions()) DSA_TRY(add_zero_partition(in, m, s, transport, comms, ports, rr.parts.tied, o));
    o.stream_masters = rc.stages == 1;
    // ZeRO-Offload on a CUDA rank: the CPU update of a whole stage runs while the GPU's
    // backward goes on, in reduce_bucket_size buckets. Which runs stream is the config's rule
    // (what the plans and the log assume too); the shard still declines a stage whose tied
    // gradient is exchanged and, without speculative_stream, steps that wait for totals.
    if (rc.streams_host_update()) o.stream_bucket = std::max<std::int64_t>(rc.reduce_bucket_elements, 1);
    // With clipping or loss scaling that stream speculates when asked (a copy of the state).
    o.speculative_stream = rc.speculative_update;
    if (rr.swap)
      o.offload = shard_options::nvme_offload{ports.swap, rr.swap->dir(), rc.offload.sub_group_size,
                                                       static_cast<std::size_t>(rc.offload.buffer_count),
                                                       rc.offload.pipeline_read, rc.offload.pipeline_write};
    add_resumed_state(rc, s, start, o);
    o.device = optimizer_device_for(in.device, rc);
    if (o.device && in.rank == 0 && s == 0 && in.process == 0)
      log_info("optimizer: fp32 masters and {} moments of every stage on {} (offload_optimizer.device = \"none\"), "
               "stepped by the fused Adam pass there",
               optim::optimizer_name(rc.optimizer.type), o.device->where());
    rr.shards.push_back(make_shard(std::move(o)));
    rr.parts.stages.push_back(m.stages[s].get());
    rr.parts.optimizers.push_back(rr.shards.back().get());
  }
  rr.parts.source = rr.source.get();
  if (start.resumed) {
    try {
      for (std::uint32_t s = 0; s < rc.stages; ++s)
        if (rr.shards[s]) rr.shards[s]->init(m.stages[s]->parameters());
    } catch (const std::exception& e) {
      return make_error(errc::format, "{}: optimizer state: {}", rc.checkpoint.dir, e.what());
    }
  }
  return rr;
}

} // namespace dsa::train
