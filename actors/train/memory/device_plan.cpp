// The device-memory plan of a CUDA rank; see device_plan.hpp.
#include "actors/train/memory/device_plan.hpp"

#include "actors/schedule_policy.hpp"
#include "actors/train/config/layer_partition.hpp"
#include "actors/train/config/limits_config.hpp"
#include "actors/train/config/pipeline_config.hpp"
#include "actors/train/memory/memory_accounting.hpp"
#include "core/log.hpp"
#include "models/bert/gpu_memory.hpp"
#include "models/bert/parameter_specs.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace dsa::train {
namespace {

constexpr std::int64_t mib = std::int64_t{1} << 20;
constexpr std::int64_t workspace_per_stage = 32 * mib; // cuda_part_params.cpp's gemm_engine::open
constexpr std::int64_t margin_fixed = 64 * mib;
constexpr std::int64_t reserve_fixed = 256 * mib;

std::string mib_up(std::int64_t bytes) { return fmt::format("{}MiB", (bytes + mib - 1) / mib); }

} // namespace

std::string device_memory_plan::describe() const {
  return fmt::format("planned peak {} = model states {} + activations {} + scratch {} + messages {} + cuBLASLt "
                     "workspaces {} + margin {}",
                     format_bytes(peak()), format_bytes(model_states), format_bytes(activations),
                     format_bytes(scratch), format_bytes(messages), format_bytes(workspaces), format_bytes(margin));
}

device_memory_plan plan_device_memory(const run_config& rc, const std::vector<bert::bert_range>& ranges,
                                      const plan_inputs& in) {
  device_memory_plan p;
  bert::gpu_micro_batch mb;
  mb.batch = rc.batch.micro_batch_size;
  mb.seq = in.seq_length;
  mb.predictions = in.predictions;
  mb.elem_size = static_cast<std::int64_t>(dtype_size(working_dtype(rc.working)));
  mb.deterministic = rc.deterministic;
  const auto kind = schedule_kind_of(rc);
  const auto S = static_cast<std::uint32_t>(ranges.size());
  const std::int64_t hidden = mb.batch * mb.seq * rc.model.hidden_size * mb.elem_size;
  for (std::uint32_t s = 0; s < S; ++s) {
    if (!in.runs(s)) continue; // another process's stage
    const bert::bert_range& r = ranges[s];
    const std::int64_t states = cuda_model_state_bytes(rc, bert::parameter_specs(rc.model, r));
    const actors::schedule_policy policy =
        actors::schedule_policy::make(kind, S, s, static_cast<std::uint32_t>(rc.batch.gradient_accumulation),
                                      static_cast<std::uint32_t>(rc.max_stashed),
                                      static_cast<std::uint32_t>(rc.max_deferred_w));
    const std::int64_t ranks = rc.ranks;
    p.model_states += ranks * states;
    p.activations += ranks * static_cast<std::int64_t>(policy.stash_slots) * bert::gpu_part_stash_bytes(rc.model, r, mb);
    p.scratch += ranks * bert::gpu_part_scratch_bytes(rc.model, r, mb);
    p.workspaces += ranks * workspace_per_stage;
    if (s + 1 < S && in.runs(s + 1)) p.messages += ranks * 2 * 2 * hidden; // the edge s -> s + 1, both ways
  }
  const std::int64_t rest = p.model_states + p.activations + p.scratch + p.messages + p.workspaces;
  p.margin = margin_fixed + rest / 20;
  return p;
}

device_budget device_budget_for(const run_config& rc, const device_choice& device) {
  device_budget b;
  if (device.device != stage_device::cuda) return b;
  if (rc.device_memory <= 0 && device.free_bytes <= 0) {
    b.source = fmt::format("{}'s free memory could not be read: no device budget", device.description);
    return b;
  }
  if (rc.device_memory > 0) {
    b.bytes = rc.device_memory;
    b.source = fmt::format("limits.device_memory {}", format_bytes(rc.device_memory));
    return b;
  }
  const std::int64_t reserve = std::max(reserve_fixed, device.total_bytes / 50);
  b.bytes = std::max<std::int64_t>(0, device.free_bytes - reserve);
  b.source = fmt::format("no limits.device_memory: {}'s free memory at start-up, {}, less {} for the CUDA libraries",
                         device.description, format_bytes(device.free_bytes), format_bytes(reserve));
  return b;
}

expected<device_memory_plan> fit_device_memory(const run_config& rc, const std::vector<bert::bert_range>& ranges,
                                               const plan_inputs& in, const device_budget& budget) {
  const device_memory_plan plan = plan_device_memory(rc, ranges, in);
  if (budget.bytes < 0 || plan.peak() <= budget.bytes) return plan;
  // Given a budget, the smallest that works; without one the device has not that much free.
  const std::string advice =
      rc.device_memory > 0
          ? fmt::format("the smallest budget that works is limits.device_memory = \"{}\"", mib_up(plan.peak()))
          : fmt::format("the device has not that much free (raising limits.device_memory above it only turns this "
                        "check into a warning before the run runs out of device memory)");
  std::string message = fmt::format("device memory ({}, {} in-process rank(s), micro-batches of {} x {} tokens): {}, "
                                    "more than the budget {}; {}",
                                    budget.source, rc.ranks, rc.batch.micro_batch_size, in.seq_length,
                                    plan.describe(), format_bytes(budget.bytes), advice);
  if (rc.offload.device == offload_device::none) {
    run_config cpu = rc;
    cpu.offload.device = offload_device::cpu;
    const std::int64_t peak = plan_device_memory(cpu, ranges, in).peak();
    message += fmt::format(". With the optimizer on the CPU (zero_optimization.offload_optimizer.device = \"cpu\") the "
                           "planned peak is {}{}",
                           format_bytes(peak), peak <= budget.bytes ? ", which fits" : "");
  }
  // ZeRO-3 where the config would run it (one pipeline stage, 1F1B, not a compressed
  // optimizer) and partition the weights (several ranks, or on one rank offload_param nvme).
  if (rc.zero_stage < 3 && rc.stages == 1 && rc.schedule == "1f1b" && !rc.optimizer.compressed()) {
    run_config zero3 = rc;
    zero3.zero_stage = 3;
    if (zero3.offload.device == offload_device::none) zero3.offload.device = offload_device::cpu;
    const bool one_rank = rc.batch.data_parallel_size <= 1;
    if (one_rank) zero3.offload.param.device = offload_device::nvme;
    zero3.zero3_device_window = 1; // its smallest: a part's weights on the device at a time
    const std::int64_t peak = plan_device_memory(zero3, ranges, in).peak();
    message += fmt::format(". With ZeRO-3 (zero_optimization.stage = 3, the optimizer on the CPU{}: each part's weights "
                           "on the device only while it runs) it is {}{}",
                           one_rank ? ", on one rank offload_param.device = \"nvme\"" : "", format_bytes(peak),
                           peak <= budget.bytes ? ", which fits" : "");
  }
  if (!rc.model.checkpoint_activations) {
    run_config ckpt = rc;
    ckpt.model.checkpoint_activations = true;
    const std::int64_t peak = plan_device_memory(ckpt, ranges, in).peak();
    message += fmt::format(". With activation checkpointing (model.checkpoint_activations = true) it is {}{}",
                           format_bytes(peak), peak <= budget.bytes ? ", which fits" : "");
  }
  message += "; a smaller train_micro_batch_size_per_gpu (more gradient accumulation) shrinks the activations";
  return make_error(errc::config, "{}", message);
}

std::int64_t choose_zero3_window(run_config& rc, const std::vector<bert::bert_range>& ranges, const plan_inputs& in,
                                 const device_budget& budget) {
  if (rc.zero_stage < 3 || !rc.zero_partitions() || rc.zero3_device_window > 0) return 0;
  std::int64_t limit = 0;
  for (const auto& r : ranges) {
    const std::int64_t l = cuda_zero3_window_limit(rc, bert::parameter_specs(rc.model, r));
    limit = limit == 0 ? l : std::min(limit, l);
  }
  limit = std::max<std::int64_t>(limit, 1);
  for (std::int64_t w = limit; w >= 1; --w) {
    rc.zero3_device_window = w;
    if (budget.bytes < 0 || plan_device_memory(rc, ranges, in).peak() <= budget.bytes) return limit;
  }
  rc.zero3_device_window = 1; // nothing fits: the refusal names the smallest plan's budget
  return limit;
}

expected<device_memory_plan> plan_run_device_memory(run_config& rc, const device_choice& device,
                                                    const plan_inputs& in) {
  if (device.device != stage_device::cuda) return device_memory_plan{};
  DSA_ASSIGN_OR_RETURN(auto ranges, partition_layers(rc.model, rc.stages, rc.partition));
  const device_budget budget = device_budget_for(rc, device);
  if (rc.device_memory > 0 && device.free_bytes > 0 && rc.device_memory > device.free_bytes)
    log_warn("limits.device_memory {} is more than the {} free on {} at start-up: the plan is checked against the "
             "budget, the device may still run out",
             format_bytes(rc.device_memory), format_bytes(device.free_bytes), device.description);
  const std::int64_t window_limit = choose_zero3_window(rc, ranges, in, budget);
  DSA_ASSIGN_OR_RETURN(auto plan, fit_device_memory(rc, ranges, in, budget));
  if (window_limit > 0)
    log_info("device memory: ZeRO-3 binds at most {} part(s)' weights on the device at once (the part computing and "
             "{} copied ahead of it){}",
             rc.zero3_device_window, rc.zero3_device_window - 1,
             rc.zero3_device_window < window_limit
                 ? fmt::format(", fewer than the {} zero_optimization.stage3_prefetch_bucket_size {} allows: the "
                               "largest window that fits the budget",
                               window_limit, rc.stage3_prefetch)
                 : fmt::format(" (zero_optimization.stage3_prefetch_bucket_size {})", rc.stage3_prefetch));
  reset_device_pool_peak(device); // the end-of-run measure is this run's
  log_info("device memory ({}, {} in-process rank(s), micro-batches of {} x {} tokens): {}", budget.source, rc.ranks,
           rc.batch.micro_batch_size, in.seq_length, plan.describe());
  return plan;
}

std::string device_plan_report(const device_memory_plan& plan, std::int64_t measured, bool& above) {
  above = false;
  if (plan.peak() == 0) return {};
  if (measured < 0)
    return fmt::format("device memory: planned peak {} (of which the pool {}); the pool's peak could not be read",
                       format_bytes(plan.peak()), format_bytes(plan.pool_peak()));
  above = measured > plan.pool_peak();
  return fmt::format("device memory: the pool's planned peak {} (the plan's {} less the cuBLASLt workspaces), "
                     "measured peak in use {}{}",
                     format_bytes(plan.pool_peak()), format_bytes(plan.peak()), format_bytes(measured),
                     above ? ": above the plan (the plan misses something; please report it with the config)" : "");
}

void log_device_plan_report(const device_memory_plan& plan, std::int64_t measured) {
  bool above = false;
  const std::string line = device_plan_report(plan, measured, above);
  if (line.empty()) return;
  if (above) log_warn("{}", line);
  else log_info("{}", line);
}

} // namespace dsa::train
