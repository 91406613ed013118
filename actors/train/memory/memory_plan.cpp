// The host-memory plan of a run and its budget; see memory_plan.hpp.
#include "actors/train/memory/memory_plan.hpp"

#include "actors/schedule_policy.hpp"
#include "actors/train/config/limits_config.hpp"
#include "actors/train/config/pipeline_config.hpp"
#include "actors/train/memory/memory_accounting.hpp"
#include "actors/train/config/layer_partition.hpp"
#include "actors/train/data/feed_source.hpp"
#include "core/file_backed.hpp"
#include "core/host_allocator.hpp"
#include "core/log.hpp"
#include "core/pinned_memory.hpp"
#include "io/aio/swap_store.hpp"
#include "io/data/shard_reader.hpp"
#include "models/bert/encoder_layer.hpp"
#include "optim/flat_layout.hpp"
#include "optim/param_reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <malloc.h>
#include <map>

namespace dsa::train {
namespace {

constexpr std::int64_t mib = std::int64_t{1} << 20;
constexpr std::int64_t margin_fixed = 16 * mib;
constexpr std::int64_t granule = optim::flat_layout::default_alignment;

std::int64_t stage_parameters(const run_config& rc, const bert::bert_range& range) {
  std::int64_t n = 0;
  for (const auto& s : bert::parameter_specs(rc.model, range)) n += shape_numel(s.shape);
  return n;
}

// One rank's activations (memory_plan.hpp).
std::int64_t rank_activations(const run_config& rc, const std::vector<bert::bert_range>& ranges, const plan_inputs& in) {
  const std::int64_t B = rc.batch.micro_batch_size, T = in.seq_length, H = rc.model.hidden_size;
  const dtype stash = working_dtype(rc.working);
  const auto layer = static_cast<std::int64_t>(bert::layer_stash_bytes(rc.model, B, T, bert::run_mode::train, stash));
  const auto kind = schedule_kind_of(rc);
  const auto S = static_cast<std::uint32_t>(ranges.size());
  const std::int64_t hidden = B * T * H * 4; // one (B, T, H) f32 tensor
  std::int64_t total = 2 * 2 * (static_cast<std::int64_t>(S) - 1) * hidden; // messages between stages
  for (std::uint32_t s = 0; s < S; ++s) {
    if (!in.runs(s)) continue; // another process's stage
    const auto& r = ranges[s];
    const actors::schedule_policy policy =
        actors::schedule_policy::make(kind, S, s, static_cast<std::uint32_t>(rc.batch.gradient_accumulation),
                                      static_cast<std::uint32_t>(rc.max_stashed),
                                      static_cast<std::uint32_t>(rc.max_deferred_w));
    const std::int64_t slots = policy.stash_slots;
    // Checkpointing keeps one f32 input per layer; the layer being recomputed holds a stash.
    const std::int64_t kept = rc.model.checkpoint_activations ? hidden : layer;
    total += slots * (r.layer_count() * kept + (r.has_embeddings() ? hidden : 0)) + layer;
    const std::int64_t head = rc.model.head == bert::head_kind::pretraining
                                  ? 2 * 4 * B * in.predictions * rc.model.vocab_size
                                  : 2 * 4 * B * T * 2;
    if (r.has_head()) total += head;
    if (kind == actors::schedule_kind::zero_bubble) {
      // Each deferred W holds copies of its products' operands (models/bert/weight_grads.hpp),
      // f32: per layer Q, K, V's input and output gradients, the attention output's and the
      // feed-forward's two, 11 (B, T, H) and 2 (B, T, I) tensors; the head's logits gradient;
      // the word table's lookup rows. Counted for the stage's deferred-W bound, beside the
      // stash slots above.
      const std::int64_t I = rc.model.intermediate_size;
      const std::int64_t per_layer = 11 * hidden + 2 * B * T * I * 4;
      const std::int64_t w = r.layer_count() * per_layer + (r.has_head() ? head / 2 : 0) +
                             (r.has_embeddings() ? hidden : 0);
      total += static_cast<std::int64_t>(policy.max_deferred_w) * w;
    }
  }
  return total;
}

// Mebibytes rounded up, so a budget written from the message always fits.
std::string mib_up(std::int64_t bytes) { return fmt::format("{}MiB", (bytes + mib - 1) / mib); }

run_config with_sub_group(run_config rc, std::int64_t sub_group) {
  rc.offload.sub_group_size = sub_group;
  return rc;
}

} // namespace

std::int64_t host_memory_plan::peak() const {
  return baseline + data_reader + model_states + activations + zero3 + communication + checkpoint + initialization +
         margin;
}

std::string host_memory_plan::describe() const {
  std::string states;
  if (swap_buffers > 0) states = fmt::format("NVMe swap buffers {}", format_bytes(swap_buffers));
  else if (optimizer_in_memory > 0) states = fmt::format("optimizer state {}", format_bytes(optimizer_in_memory));
  if (speculation > 0)
    states += fmt::format("{}the speculative update's rollback copy {}", states.empty() ? "" : ", ",
                          format_bytes(speculation));
  if (!states.empty()) states = " (of which " + states + ")";
  std::string gathers =
      zero3 > 0 ? fmt::format(" + ZeRO-3 parts in flight {}", format_bytes(zero3)) : std::string();
  if (initialization > 0) gathers += fmt::format(" + start-up's whole weights beyond that {}", format_bytes(initialization));
  const std::string reader =
      data_reader > 0 ? fmt::format(" + shard reader {}", format_bytes(data_reader)) : std::string();
  return fmt::format("planned peak {} = baseline {}{} + model states {}{} + activations {}{} + gradient "
                     "communication {} + checkpoint staging {} + margin {}",
                     format_bytes(peak()), format_bytes(baseline), reader, format_bytes(model_states), states,
                     format_bytes(activations), gathers, format_bytes(communication), format_bytes(checkpoint),
                     format_bytes(margin));
}

namespace {
// ZeRO-3 beyond the model states, per rank and stage: the gathered weights (the part the
// compute holds, the largest, plus what the fetcher may gather ahead: at most
// stage3_prefetch_bucket_size elements, within stage3_max_live_parameters) and the f32
// gradients of whole tensors between a part's backward and their sum into the partition
// (that part's, plus what waits to be summed: at most reduce_bucket_size elements).
// Parts: the embeddings, each layer, the head with the tied word embedding; tensors of at
// most stage3_param_persistence_threshold elements stay whole (in the model states).
std::int64_t zero3_in_flight(const run_config& rc, const std::vector<bert::param_spec>& specs) {
  std::map<std::string, std::int64_t> parts;
  std::int64_t word = 0;
  for (const auto& spec : specs) {
    const std::int64_t n = shape_numel(spec.shape);
    if (spec.name == bert::word_embeddings_name()) word = n;
    if (n <= rc.stage3_persistence) continue;
    std::string key = "head";
    if (spec.name.rfind("bert.embeddings.", 0) == 0) key = "embeddings";
    for (std::int64_t l = 0; l < rc.model.num_layers && key == "head"; ++l)
      if (spec.name.rfind(bert::layer_prefix(l), 0) == 0) key = bert::layer_prefix(l);
    parts[key] += n;
  }
  if (parts.count("head") && word > rc.stage3_persistence) parts["head"] += word; // tied: the head gathers it too
  std::int64_t largest = 0, all = 0;
  for (const auto& [key, n] : parts) {
    largest = std::max(largest, n);
    all += n;
  }
  // Neither can exceed what the stage has to gather or to sum.
  const std::int64_t w = static_cast<std::int64_t>(dtype_size(working_dtype(rc.working)));
  const std::int64_t ahead = std::min({rc.stage3_prefetch, rc.stage3_max_live, all - largest});
  // A tensor larger than reduce_bucket_size still goes to the sum whole (the queue takes it
  // when empty), and the part's backward holds its gradients until it hands them over.
  std::int64_t largest_tensor = 0;
  for (const auto& spec : specs) largest_tensor = std::max(largest_tensor, shape_numel(spec.shape));
  const std::int64_t queued = std::max(std::min(rc.reduce_bucket_elements, all), largest_tensor);
  return w * (largest + ahead) + 4 * (largest + queued);
}
} // namespace

host_memory_plan plan_host_memory(const run_config& rc, const std::vector<bert::bert_range>& ranges,
                                  const plan_inputs& in) {
  host_memory_plan p;
  p.baseline = in.baseline + (rc.ranks - 1) * in.data_provider;
  p.data_reader = rc.ranks * in.data_reader;
  const bool reduces = rc.batch.data_parallel_size > 1;
  for (std::size_t s = 0; s < ranges.size(); ++s) {
    const std::int64_t n = stage_parameters(rc, ranges[s]);
    if (!in.runs(s)) { // another process's stage: at most its masters, gathered for a checkpoint
      if (in.gathers_masters && in.writes_checkpoints) p.checkpoint += 4 * n;
      continue;
    }
    const auto zero = run_zero_sizes(rc, ranges, s);
    const model_state_bytes b = expected_model_states(n, rc.working, zero);
    p.model_states += rc.ranks * b.total();
    // A CUDA stage with partitioned gradients (ZeRO-2 on one stage) still keeps its whole f32
    // gradients on the host, pinned, where each micro-batch's come down (cuda_stage.hpp);
    // under ZeRO-3 only the largest part's, in its staging buffer, and its weight uploads'
    // buffers (cuda_zero3.hpp).
    if (rc.backend == "cuda" && zero && zero->grads_partitioned)
      p.model_states += rc.ranks * (zero->stage >= 3 ? cuda_zero3_staging_bytes(rc, bert::parameter_specs(rc.model, ranges[s]))
                                                     : 4 * n);
    p.optimizer_in_memory += rc.ranks * (b.masters + b.moments);
    p.swap_buffers += rc.ranks * b.swap_buffers;
    // pipeline.speculative_update: each shard copies what its step changes (a swapped
    // shard only its gradients: its state's speculative writes go to other files); a
    // speculative stream in host memory copies each parameter's as it steps (whole_shard).
    const bool speculates = (rc.speculative_update && ranges.size() > 1 &&
                             (rc.gradient_clipping > 0 || rc.working == precision::f16)) ||
                            (rc.speculative_host_stream() && ranges.size() == 1);
    if (speculates) {
      const std::int64_t copy = b.masters + b.moments + b.half_masters + 4 * (zero ? zero->partition : n);
      p.speculation += rc.ranks * copy;
      p.model_states += rc.ranks * copy;
    }
    if (reduces) p.communication += rc.ranks * 2 * 4 * std::min(rc.reduce_bucket_elements, n);
    if (zero && zero->stage >= 3) {
      p.zero3 += rc.ranks * zero3_in_flight(rc, bert::parameter_specs(rc.model, ranges[s]));
      // At start-up the stage's whole weights exist until they are partitioned, while
      // its gradient partition is not touched yet (partition_grads zeroes it later); built
      // in a file, a tensor of them at a time (and an f32 copy of it for half weights).
      std::int64_t largest = 0;
      for (const auto& spec : bert::parameter_specs(rc.model, ranges[s])) largest = std::max(largest, shape_numel(spec.shape));
      p.initialization += rc.ranks * (builds_weights_in_file(rc) ? 8 * largest
                                      : n * static_cast<std::int64_t>(dtype_size(working_dtype(rc.working))) - b.grads);
    }
    // A checkpoint reads a shard's own tensors in memory; ZeRO over several ranks gathers
    // the stage's whole fp32 masters (each rank writes its own moments' file from views);
    // swapped state is first read back from NVMe (its partition's masters and moments).
    if (zero && in.writes_checkpoints) {
      const std::int64_t gathered = reduces ? 4 * zero->padded : 0;
      // Swapped: the masters are read back whole (one rank and one stage: streamed into the
      // model file a tensor at a time, through a read buffer as large), the moments one swap
      // chunk at a time.
      std::int64_t largest = 0;
      for (const auto& spec : bert::parameter_specs(rc.model, ranges[s])) largest = std::max(largest, shape_numel(spec.shape));
      const bool streamed = ranges.size() == 1 && rc.batch.data_parallel_size == 1;
      const std::int64_t read_back =
          zero->swap_buffers > 0
              ? (streamed ? 8 * largest : 4 * zero->partition) +
                    8 * aio::swap_chunk_numel(rc.offload.sub_group_size, optim::flat_layout::default_alignment,
                                              zero->partition)
              : 0;
      p.checkpoint += rc.ranks * (gathered + read_back);
    }
  }
  p.activations = rc.ranks * rank_activations(rc, ranges, in);
  std::int64_t whole = 0;
  for (const auto& r : ranges) whole += stage_parameters(rc, r);
  plan_inputs every_stage = in; // the evaluation runs the whole model (on rank 0)
  every_stage.here.clear();
  p.evaluation = rc.ranks * whole * static_cast<std::int64_t>(dtype_size(working_dtype(rc.working))) + 8 * whole +
                 rank_activations(rc, ranges, every_stage);
  p.initialization = std::max<std::int64_t>(0, p.initialization - (p.activations + p.zero3 + p.communication + p.checkpoint));
  p.margin = margin_fixed + (p.baseline + p.data_reader + p.model_states + p.activations + p.zero3 + p.communication +
                             p.checkpoint + p.initialization) /
                                10;
  return p;
}

bool builds_weights_in_file(const run_config& rc) {
  return rc.zero_stage >= 3 && rc.offload.param.swaps() && rc.gradients_partitioned() && rc.backend == "cpu";
}

void weights_to_nvme(run_config& rc, std::int64_t buffer_size) {
  rc.offload.param.device = offload_device::nvme;
  rc.offload.param.nvme_path = rc.offload.nvme_path;
  rc.offload.param.max_in_cpu = 0;
  rc.offload.param.buffer_size = buffer_size;
}

bool may_move_weights(const run_config& rc) {
  return rc.zero_stage >= 3 && rc.offload.swaps() && !rc.offload.param.swaps();
}

namespace {
constexpr std::int64_t smallest_param_buffer = 1 << 16; // elements: offload_param buffers the plan goes down to

// With the optimizer state on NVMe, the largest sub_group_size (a multiple of the
// granule, at most the configured one) whose plan fits the budget; none if even one
// granule does not. The peak grows with the sub-group.
std::optional<std::int64_t> fitting_sub_group(const run_config& rc, const std::vector<bert::bert_range>& ranges,
                                              const plan_inputs& in) {
  auto fits = [&](std::int64_t g) { return plan_host_memory(with_sub_group(rc, g), ranges, in).peak() <= rc.host_memory; };
  if (!rc.offload.swaps() || !fits(granule)) return std::nullopt;
  std::int64_t largest = 0;
  for (std::size_t s = 0; s < ranges.size(); ++s)
    if (auto z = run_zero_sizes(rc, ranges, s)) largest = std::max(largest, z->partition);
  std::int64_t lo = 1, hi = std::max<std::int64_t>(1, std::min(rc.offload.sub_group_size, largest) / granule); // in granules
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid * granule)) lo = mid;
    else hi = mid - 1;
  }
  return lo * granule;
}
} // namespace

namespace {
// Whether "auto" may move the gradient partition: it exists (or will once the plan moves
// the weights, which on one rank is what makes ZeRO-3 partition), on NVMe's terms.
bool may_move_grads(const run_config& rc) {
  if (rc.gradient_partition != "auto" || rc.grads_on_nvme) return false;
  if (!grads_to_nvme_refusal(rc)) return true;
  if (!may_move_weights(rc)) return false;
  run_config moved = rc;
  weights_to_nvme(moved, rc.offload.param.buffer_size);
  return !grads_to_nvme_refusal(moved);
}

expected<memory_decision> fit_with(const run_config& rc, const std::vector<bert::bert_range>& ranges,
                                   const plan_inputs& in);
} // namespace

expected<memory_decision> fit_host_memory(const run_config& rc, const std::vector<bert::bert_range>& ranges,
                                          const plan_inputs& in) {
  auto d = fit_with(rc, ranges, in);
  if (d) return d;
  // What the moves above could not fit: ZeRO's gradient partition leaves memory too (a file
  // in the NVMe swap folder, read and written a window at a time), then the same moves.
  run_config moved = rc;
  std::string also;
  if (may_move_grads(rc)) {
    moved.grads_on_nvme = true;
    also = "the gradient partition on NVMe too";
    auto g = fit_with(moved, ranges, in);
    if (g) {
      g->grads_to_nvme = true;
      return g;
    }
    d = std::move(g);
  }
  // Then ZeRO-3's parts in flight shrink: the weights gathered ahead of the compute
  // (stage3_prefetch_bucket_size) down to none, the largest prefetch that fits. (Each
  // process may choose its own: the gathers keep their order, only their timing changes.)
  if (rc.zero_stage >= 3 && rc.stage3_prefetch > 0) {
    run_config c = moved;
    c.stage3_prefetch = 0;
    also += also.empty() ? "no ZeRO-3 prefetch" : ", and no ZeRO-3 prefetch";
    auto none = fit_with(c, ranges, in);
    if (!none) return make_error(none.err().code, "{} (with {})", none.err().message, also);
    std::int64_t lo = 0, hi = rc.stage3_prefetch;
    while (lo < hi) {
      c.stage3_prefetch = lo + (hi - lo + 1) / 2;
      if (fit_with(c, ranges, in)) lo = c.stage3_prefetch;
      else hi = c.stage3_prefetch - 1;
    }
    c.stage3_prefetch = lo;
    auto p = fit_with(c, ranges, in);
    p->grads_to_nvme = moved.grads_on_nvme;
    p->stage3_prefetch = lo;
    return p;
  }
  if (also.empty()) return d;
  return make_error(d.err().code, "{} (with {})", d.err().message, also);
}

namespace {
expected<memory_decision> fit_with(const run_config& rc, const std::vector<bert::bert_range>& ranges,
                                   const plan_inputs& in) {
  memory_decision d;
  d.plan = plan_host_memory(rc, ranges, in);
  const std::int64_t budget = rc.host_memory;
  if (budget <= 0 || d.plan.peak() <= budget) return d;
  auto plan_at = [&](std::int64_t g) { return plan_host_memory(with_sub_group(rc, g), ranges, in); };
  if (auto g = fitting_sub_group(rc, ranges, in)) {
    d.sub_group_size = *g;
    d.plan = plan_at(*g);
    return d;
  }
  // ZeRO-3: the working weights' partitions can leave memory too (offload_param on NVMe),
  // read through offload_param's buffers: the largest buffer_size (the configured one, then
  // halving it down to 64Ki elements) at which the plan fits, first at the configured
  // sub_group_size, then at the largest that fits.
  run_config moved = rc;
  if (may_move_weights(rc)) {
    d.weights_to_nvme = true;
    for (std::int64_t size = rc.offload.param.buffer_size;; size /= 2) {
      weights_to_nvme(moved, size);
      d.param_buffer_size = size;
      d.plan = plan_host_memory(moved, ranges, in);
      if (d.plan.peak() <= budget) return d;
      if (auto g = fitting_sub_group(moved, ranges, in)) {
        d.sub_group_size = *g;
        d.plan = plan_host_memory(with_sub_group(moved, *g), ranges, in);
        return d;
      }
      if (size / 2 < smallest_param_buffer) break; // `moved` keeps the smallest tried
    }
  }
  // Nothing fits: the smallest budget that would, as configured (with the weights on NVMe
  // where the plan would move them) and with NVMe offload.
  const host_memory_plan smallest =
      may_move_weights(rc) ? plan_host_memory(with_sub_group(moved, granule), ranges, in)
      : rc.offload.swaps() ? plan_at(granule)
                           : plan_host_memory(rc, ranges, in);
  std::string message = fmt::format(
      "limits.host_memory = {} is too small for this run: {}{}; the smallest budget that works is {}", format_bytes(budget),
      smallest.describe(),
      rc.offload.swaps() ? fmt::format(" (NVMe offload at the smallest zero_optimization.sub_group_size, {}{})", granule,
                                       may_move_weights(rc) ? ", and the working weights on NVMe too" : "")
                         : "",
      mib_up(smallest.peak()));
  if (!rc.offload.swaps()) {
    run_config off = rc;
    off.zero_stage = std::max(rc.zero_stage, 1);
    off.offload.device = offload_device::nvme;
    off.offload.sub_group_size = granule;
    const host_memory_plan with_nvme = plan_host_memory(off, ranges, in);
    const std::string needs = rc.zero_stage < 1 ? "zero_optimization.stage = 1 and " : "";
    if (with_nvme.peak() <= budget)
      message += fmt::format(". With {}zero_optimization.offload_optimizer.device = \"nvme\" (and nvme_path) the fp32 "
                             "masters and moments would leave memory and the run would fit: {}",
                             needs, with_nvme.describe());
    else if (with_nvme.peak() < smallest.peak())
      message += fmt::format(". With {}zero_optimization.offload_optimizer.device = \"nvme\" the smallest budget "
                             "would be {}",
                             needs, mib_up(with_nvme.peak()));
  }
  if (!rc.offload.param.swaps() && rc.zero_stage < 3)
    message += ". With NVMe offload on, the plan sizes its sub-groups by itself, and with ZeRO stage 3 moves the "
               "working weights there too; offloading the parameters (offload_param) needs zero_optimization.stage = 3";
  return make_error(errc::config, "{}", message);
}
} // namespace

void cap_pinned_memory(const run_config& rc) {
  if (rc.host_memory > 0) pinned_owner::instance().set_limit(rc.host_memory);
}

expected<host_memory_plan> plan_run_memory(run_config& rc, const batch_provider& data, std::int64_t rss_before_data,
                                           const std::vector<bool>& here, bool gathers_masters,
                                           plan_inputs* used) {
  DSA_ASSIGN_OR_RETURN(auto ranges, partition_layers(rc.model, rc.stages, rc.partition));
  plan_inputs in;
  in.here = here;
  in.gathers_masters = gathers_masters;
  if (rc.model.head == bert::head_kind::squad) {
    in.seq_length = rc.data.max_seq_length; // features are padded to it (a copy of them all would be large)
  } else {
    // T and P from one micro-batch of a copy of the data (the run's own is untouched).
    auto probe = data.clone();
    const bert::bert_batch b = probe->next(rc.batch.micro_batch_size);
    in.seq_length = b.seq_length();
    if (b.masked_lm_positions.defined()) in.predictions = b.masked_lm_positions.shape().back();
    in.data_reader = data::shard_reader::resident_bound(in.seq_length, in.predictions);
  }
  // With a budget, glibc returns every freed block of 1 MiB or more to the system at
  // once: its default threshold grows after the first large free (up to 32 MiB), and
  // freed tensors then stay resident in the arenas, which the plan cannot bound
  // (measured with per-thread arenas: 2 ranks of bert-mini peaked 25% above their
  // tensors' peak without it, 10% with it; tools/malloc_tuning.cpp now makes one arena). The price is a page fault per page of a new tensor. The trim
  // threshold goes back to glibc's default too (dsactor raises both to keep freed tensor
  // memory for reuse when there is no budget: tools/malloc_tuning.hpp).
  if (rc.host_memory > 0) {
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 * 1024);
    set_host_cache_limit(0); // tensors' large blocks too (core/host_allocator.hpp)
    malloc_trim(0);          // what the data provider and the probe freed, kept under the earlier settings
  }
  cap_pinned_memory(rc);
  in.baseline = proc_status_bytes("VmRSS");
  in.data_provider = std::max<std::int64_t>(0, in.baseline - rss_before_data);
  in.writes_checkpoints = rc.checkpoint.save_final || rc.checkpoint.save_interval > 0;
  DSA_ASSIGN_OR_RETURN(auto d, fit_host_memory(rc, ranges, in));
  if (used) *used = in;
  const std::string budget =
      rc.host_memory > 0 ? fmt::format("limits.host_memory {}", format_bytes(rc.host_memory)) : "no limits.host_memory";
  log_info("host memory ({}, {} in-process rank(s), micro-batches of {} x {} tokens): {}", budget, rc.ranks,
           rc.batch.micro_batch_size, in.seq_length, d.plan.describe());
  if (d.weights_to_nvme) {
    log_info("host memory: zero_optimization.offload_param.device \"{}\" -> \"nvme\" (nvme_path {}, max_in_cpu 0, "
             "buffer_size {}): with the optimizer state alone on NVMe the run does not fit limits.host_memory; the "
             "working weights' partitions go there too", rc.offload.param.device == offload_device::cpu ? "cpu" : "none",
             rc.offload.nvme_path, d.param_buffer_size);
    weights_to_nvme(rc, d.param_buffer_size);
  }
  if (d.grads_to_nvme) {
    log_info("host memory: limits.gradient_partition \"auto\" -> \"nvme\": the gradient partition (4 bytes per "
             "partition element) goes to a file in the NVMe swap folder under {}, written and read a window of {} at a "
             "time, since the run does not fit limits.host_memory with it in memory",
             rc.offload.nvme_path, format_bytes(file_backed_window_bytes()));
    rc.grads_on_nvme = true;
  }
  if (d.stage3_prefetch) {
    log_info("host memory: zero_optimization.stage3_prefetch_bucket_size {} -> {}: the largest whose weights gathered "
             "ahead of the compute fit limits.host_memory",
             rc.stage3_prefetch, *d.stage3_prefetch);
    rc.stage3_prefetch = *d.stage3_prefetch;
  }
  if (d.sub_group_size) {
    log_info("host memory: zero_optimization.sub_group_size {} -> {}: the largest whose NVMe swap buffers fit "
             "limits.host_memory",
             rc.offload.sub_group_size, *d.sub_group_size);
    rc.offload.sub_group_size = *d.sub_group_size;
  }
  return d.plan;
}

std::int64_t host_memory_plan::evaluation_peak() const {
  // At the end the model states are all still there, beside the baseline and the margin.
  const std::int64_t held = baseline + model_states + evaluation;
  return held + margin_fixed + held / 10;
}

bool host_memory_plan::evaluation_fits(const run_config& rc) const {
  return rc.host_memory <= 0 || evaluation_peak() <= rc.host_memory;
}

} // namespace dsa::train
