// Building the plan of a pipeline run; see plan.hpp.
#include "actors/plan.hpp"

#include "core/error.hpp"

#include <fmt/format.h>

namespace dsa::actors {

namespace {
std::string role_name(const pipeline_options& options, std::uint32_t id) {
  if (id == pipeline_plan::coordinator_id) return "coordinator";
  if (id == pipeline_plan::feeder_id) return "feeder";
  if (id == pipeline_plan::tracer_id) return "tracer";
  if (id < 3 + options.stages) return fmt::format("stage {}", id - 3);
  if (id < 3 + 2 * options.stages) return fmt::format("optimizer {}", id - 3 - options.stages);
  return fmt::format("reducer {}", id - 3 - 2 * options.stages);
}
} // namespace

std::string pipeline_plan::actor_name(std::uint32_t id) const {
  std::string name = role_name(options, id);
  if (dp_size > 1) name += fmt::format(" of rank {}", dp_rank);
  return name;
}

pipeline_plan make_plan(const pipeline_options& options, slot_table& slots, std::uint32_t first_step, int dp_rank,
                        int dp_size) {
  DSA_CHECK(options.stages > 0 && options.micro_batches > 0 && options.steps > 0,
            "a pipeline needs stages, micro-batches and steps (got {}, {}, {})", options.stages,
            options.micro_batches, options.steps);
  DSA_CHECK(first_step <= ~0u - options.steps, "first step {} + {} steps overflows the step counter", first_step,
            options.steps);
  pipeline_plan plan;
  plan.options = options;
  plan.first_step = first_step;
  DSA_CHECK(dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size, "data-parallel rank {} of {}", dp_rank, dp_size);
  plan.dp_rank = dp_rank;
  plan.dp_size = dp_size;
  plan.feed_slots = feed_slots_for(options.stages);
  plan.input_edge = slots.add_edge("input", plan.feed_slots, 1);
  plan.labels_edge = slots.add_edge("labels", plan.feed_slots, 1);
  for (std::uint32_t s = 0; s + 1 < options.stages; ++s) {
    plan.activation_edges.push_back(slots.add_edge(fmt::format("activation {}", s), options.activation_slots, 1));
    plan.gradient_edges.push_back(slots.add_edge(fmt::format("gradient {}", s), options.gradient_slots, 1));
  }
  for (std::uint32_t s = 0; s < options.stages; ++s) {
    plan.grads_edges.push_back(slots.add_edge(fmt::format("grads {}", s), 1, 0));
    plan.reduced_edges.push_back(slots.add_edge(fmt::format("reduced {}", s), 1, 0));
    plan.params_edges.push_back(slots.add_edge(fmt::format("params {}", s), 1, 0));
  }
  if (options.tied_ends && options.stages > 1) {
    plan.tied_up_edge = slots.add_edge("tied up", 1, 1);
    plan.tied_down_edge = slots.add_edge("tied down", 1, 1);
  }
  return plan;
}

} // namespace dsa::actors
