// The device-memory budget of a CUDA rank ([limits] device_memory): what this process's
// stages will hold on their GPU at the peak, planned at start-up before anything is
// allocated there, checked against the budget, and set against the pool's measured peak
// at the end of the run (trainer.cpp).
//
// The plan, for the process's device (its in-process ranks share it):
//   model states  per stage and rank: cuda_model_state_bytes (the part's working copies
//                 and f32 gradients; with the GPU-resident optimizer its masters, moments
//                 and working copies too, and its gradient scratch, the largest parameter
//                 in f32)
//   activations   each stage's stash slots (its schedule's micro-batches between forward
//                 and backward) times the part's stash per micro-batch
//                 (bert::gpu_part_stash_bytes)
//   scratch       each stage's most at once beyond its stashes (bert::gpu_part_scratch_bytes),
//                 summed: the stages of a process compute at the same time
//   messages      activation and gradient slots between two stages of this process (2 each
//                 way per edge, in the working precision, on the device)
//   workspaces    each stage's cuBLASLt workspace (32 MiB, outside the pool)
//   margin        what the plan does not model (the pool's rounding, small arrays,
//                 cuBLASLt's own allocations): 64 MiB + 5% of the rest
// The budget is limits.device_memory, or without it the device's free bytes at start-up
// minus a reserve (256 MiB or 2% of the device, the larger) for the CUDA libraries' own
// allocations. Under ZeRO-3 the plan chooses the device window (how many parts' weights
// are bound at once: the part computing and those copied ahead of it), the largest that
// stage3_prefetch_bucket_size allows and the budget holds. It refuses a run that does not
// fit, naming the smallest budget that works and what the optimizer on the CPU, ZeRO-3 or
// activation checkpointing would need.
#pragma once

#include "actors/train/config/run_config.hpp"
#include "actors/train/memory/memory_plan.hpp"
#include "actors/train/stage/device_choice.hpp"
#include "core/error.hpp"
#include "models/bert/bert_range.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::train {

struct device_memory_plan {
  std::int64_t model_states = 0, activations = 0, scratch = 0, messages = 0, workspaces = 0, margin = 0;
  std::int64_t peak() const { return model_states + activations + scratch + messages + workspaces + margin; }
  // What of the peak comes from the device's pool (all but the cuBLASLt workspaces): what
  // the pool's high-water mark is set against.
  std::int64_t pool_peak() const { return peak() - workspaces; }
  // "planned peak 1.20 GiB = model states ... + activations ... + scratch ... + messages
  // ... + cuBLASLt workspaces ... + margin ..."
  std::string describe() const;
};

// The plan at rc's settings; in.seq_length and in.predictions give the micro-batch, in.here
// the stages this process runs.
device_memory_plan plan_device_memory(const run_config& rc, const std::vector<bert::bert_range>& ranges,
                                      const plan_inputs& in);

// The budget the plan is checked against, and where it comes from (for the messages).
struct device_budget {
  std::int64_t bytes = -1; // -1: none (the CPU, or the free memory could not be read)
  std::string source; // "limits.device_memory 8.00 GiB" or "cuda:0's free memory at start-up ..."
};
// limits.device_memory, or the device's free bytes at start-up minus the reserve; none on
// the CPU or when the free bytes could not be read.
device_budget device_budget_for(const run_config& rc, const device_choice& device);

// The plan within the budget, or an errc::config error naming the budget, the plan's parts,
// the smallest budget that works and the plans with the optimizer on the CPU
// (offload_optimizer.device = "cpu") and with activation checkpointing, where they differ.
expected<device_memory_plan> fit_device_memory(const run_config& rc, const std::vector<bert::bert_range>& ranges,
                                               const plan_inputs& in, const device_budget& budget);

// ZeRO-3 with partitions on a CUDA rank (cuda_zero3.hpp), unless rc.zero3_device_window is
// set already: sets it to the largest window (parts' weights bound on the device at once)
// whose plan fits the budget, from cuda_zero3_window_limit down to 1 (1 when none fits:
// the refusal then names the smallest plan's budget); returns that limit. 0: nothing chosen.
std::int64_t choose_zero3_window(run_config& rc, const std::vector<bert::bert_range>& ranges, const plan_inputs& in,
                                 const device_budget& budget);

// The run's start-up on a CUDA rank: chooses the ZeRO-3 window, plans, logs the plan,
// refuses what does not fit; warns when limits.device_memory is more than the device had
// free. Nothing on the CPU.
expected<device_memory_plan> plan_run_device_memory(run_config& rc, const device_choice& device,
                                                    const plan_inputs& in);

// The end of the run: planned (from the pool) against the pool's measured high-water mark,
// `measured` (-1: not readable); `above` when the measure passed the plan (empty for an
// empty plan). log_device_plan_report logs it, as a warning when above.
std::string device_plan_report(const device_memory_plan& plan, std::int64_t measured, bool& above);
void log_device_plan_report(const device_memory_plan& plan, std::int64_t measured);

} // namespace dsa::train
