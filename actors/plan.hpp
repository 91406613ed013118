// The plan of a pipeline run: its shape, the edges (with slot counts) between
// feeder, stages, reducers and optimizer shards, and the actor ids used in the trace.
#pragma once

#include "actors/feed_state.hpp"
#include "actors/schedule_policy.hpp"
#include "actors/slot_table.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::actors {

// Which gradient sums an optimizer update needs (grad_totals::global).
enum class grad_scope : std::uint8_t {
  global,    // every stage's: the reducers exchange their shares first (clipping, overflow)
  per_stage, // its own stage's only: each shard updates as soon as its stage's gradients are reduced
};

// A bucket of a stage's gradients: the parameters [first, last) of its
// stage_compute::parameters(), published to the reducer in one slot.
struct grad_bucket {
  std::uint32_t first = 0, last = 0;
};

// Buckets over parameters of `sizes` elements, in the order backward finishes
// them: from the last parameter down, each taking consecutive parameters while
// their total stays within `bucket_elements` (a larger parameter alone).
std::vector<grad_bucket> make_grad_buckets(const std::vector<std::int64_t>& sizes, std::int64_t bucket_elements);

struct pipeline_options {
  std::uint32_t stages = 1;
  std::uint32_t micro_batches = 1; // gradient accumulation steps M
  std::uint32_t steps = 1;         // optimizer steps this run performs
  // run_result::losses holds every step's loss (8 bytes a step, allocated at the start);
  // false keeps only the last (dsactor run: a long run's memory does not follow its length).
  bool keep_losses = true;
  schedule_kind schedule = schedule_kind::one_f_one_b;
  std::uint32_t max_stashed = 0;      // zero_bubble: micro-batches held from forward to W (0: stages)
  std::uint32_t max_deferred_w = 0;   // zero_bubble: micro-batches whose W may wait (0: what the stash leaves)
  std::uint32_t activation_slots = 2; // stage s -> s + 1
  std::uint32_t gradient_slots = 2;   // stage s + 1 -> s
  grad_scope totals = grad_scope::global;
  // With global totals and several stages: each reducer tells its shard (reduced_early)
  // when its stage's gradients are final, and the shard may update before the totals
  // are in, rolling back when clipping or an overflow says so (pipeline.speculative_update).
  bool speculative_update = false;
  // The first and the last stage hold one shared (tied) parameter whose gradients
  // are summed before the update, like BERT's word embedding and MLM decoder.
  bool tied_ends = false;
  // [s]: stage s's gradient buckets in publish order (the grads edge gets one slot
  // per bucket); empty, or empty for a stage: one bucket of all its parameters.
  std::vector<std::vector<grad_bucket>> grad_buckets{};
  // [s]: stage s's shard streams its update (optimizer_compute::stream_elements): its
  // buckets go out as backward finishes them and its reducer reduces them one by one,
  // telling the shard (reduced_part). Empty: no stage streams.
  std::vector<bool> streamed{};
};

// Which process runs each stage of this replica, when its stages are spread over
// several processes (pipeline stages across processes, pipe_link.hpp). Empty: every
// stage runs in this process.
struct stage_placement {
  std::vector<int> process; // [s]: the job transport's rank of the process running stage s
  int here = 0;             // this process's rank in that transport
  bool split() const { return !process.empty(); }
  bool local(std::uint32_t s) const { return process.empty() || process.at(s) == here; }
  // The other processes of this replica's pipeline, each once, in rank order.
  std::vector<int> peers() const;
};

struct pipeline_plan {
  pipeline_options options;
  stage_placement placement;
  bool local(std::uint32_t s) const { return placement.local(s); }
  // Absolute number of the run's first step: the run performs steps
  // [first_step, end_step()), and parameter version k is the input of step k.
  std::uint32_t first_step = 0;
  // This replica's data-parallel rank and the number of replicas; actor names carry
  // the rank when there are several ("stage 1 of rank 2").
  int dp_rank = 0;
  int dp_size = 1;
  std::uint32_t end_step() const { return first_step + options.steps; }
  // Slots of each feed edge: feed_slots_for(stages), enough for the first stage's
  // 1F1B warm-up (feed_state.hpp).
  std::uint32_t feed_slots = 0;
  std::uint32_t input_edge = 0;  // feeder -> stage 0: {input}
  std::uint32_t labels_edge = 0; // feeder -> stage S-1: {labels}
  std::vector<std::uint32_t> activation_edges; // [s]: stage s -> s + 1, {activation}
  std::vector<std::uint32_t> gradient_edges;   // [s]: stage s + 1 -> s, {dLoss/d activation}
  std::vector<std::uint32_t> grads_edges;      // [s]: stage s -> reducer s, accumulated parameter gradients (a slot per bucket)
  std::vector<std::uint32_t> reduced_edges;    // [s]: reducer s -> shard s, reduced f32 gradients
  std::vector<std::uint32_t> params_edges;     // [s]: shard s -> stage s, a parameter version
  // With tied_ends and several stages: the last stage's tied gradient to the first
  // stage's reducer, and the sum back (none otherwise).
  static constexpr std::uint32_t no_edge = ~0u;
  std::uint32_t tied_up_edge = no_edge;
  std::uint32_t tied_down_edge = no_edge;
  bool exchanges_tied() const { return tied_up_edge != no_edge; }
  // Stage s's gradient buckets (options.grad_buckets[s]); empty: one bucket of every parameter.
  const std::vector<grad_bucket>& buckets_of(std::uint32_t s) const;
  bool streams(std::uint32_t s) const { return s < options.streamed.size() && options.streamed[s]; }
  std::uint32_t grads_slots(std::uint32_t s) const;

  static constexpr std::uint32_t coordinator_id = 0;
  static constexpr std::uint32_t feeder_id = 1;
  static constexpr std::uint32_t tracer_id = 2;
  std::uint32_t stage_id(std::uint32_t s) const { return 3 + s; }
  std::uint32_t shard_id(std::uint32_t s) const { return 3 + options.stages + s; }
  std::uint32_t reducer_id(std::uint32_t s) const { return 3 + 2 * options.stages + s; }
  std::uint32_t actor_count() const { return 3 + 3 * options.stages; }
  // "coordinator", "feeder", "tracer", "stage 0", ..., "optimizer 0", ..., "reducer 0", ...,
  // each followed by " of rank r" when dp_size > 1.
  std::string actor_name(std::uint32_t id) const;
};

// Adds the plan's edges to `slots` (each with its slot count). first_step: see pipeline_plan.
// placement: see stage_placement (its process list has one entry per stage, or none).
pipeline_plan make_plan(const pipeline_options& options, slot_table& slots, std::uint32_t first_step = 0,
                        int dp_rank = 0, int dp_size = 1, stage_placement placement = {});

} // namespace dsa::actors
