// A discrete-event simulation of S stage_schedulers wired as a pipeline, with
// unit-time work, instant messages and the real feeder's slot rule (feed_state):
// the CAF-free oracle for the pick rule.
#pragma once

#include "actors/stage_scheduler.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::test {

struct sim_options {
  std::uint32_t stages = 2, micro_batches = 4, steps = 1;
  actors::schedule_kind schedule = actors::schedule_kind::one_f_one_b;
  // backward_time: the whole backward, or under zero_bubble its B; weight_time: W.
  std::uint32_t forward_time = 1, backward_time = 1, weight_time = 1;
  std::uint32_t max_stashed = 0;    // zero_bubble's held bound (0: stages)
  std::uint32_t max_deferred_w = 0; // zero_bubble's deferred-W bound (0: what the stash leaves)
  actors::stage_credits credits{};
};

struct sim_op {
  actors::work_kind kind;
  std::uint32_t step, micro_batch, start, end; // unit times
};

// Per stage, the forwards, backwards and W work in the order they ran (loads left out).
// Checks on the way (a failed DSA_CHECK): every stage's micro-batches held between forward
// and W within the policy's stash slots, its deferred W within the policy's bound, and a step's
// gradients published (its last W, or last backward) only after all its W ran.
std::vector<std::vector<sim_op>> simulate_pipeline(const sim_options& opt);

// DeepSpeed TrainSchedule's order of one step at stage s: "F0 F1 B0 ...".
std::string deepspeed_order(std::uint32_t stages, std::uint32_t stage, std::uint32_t micro_batches);
// The same rendering of simulated ops of one step.
std::string render_order(const std::vector<sim_op>& ops, std::uint32_t step);

} // namespace dsa::test
