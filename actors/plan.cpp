// Building the plan of a pipeline run; see plan.hpp.
#include "actors/plan.hpp"

#include "core/error.hpp"

#include <fmt/format.h>

#include <algorithm>

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

std::vector<grad_bucket> make_grad_buckets(const std::vector<std::int64_t>& sizes, std::int64_t bucket_elements) {
  std::vector<grad_bucket> out;
  auto end = static_cast<std::uint32_t>(sizes.size());
  while (end > 0) {
    std::uint32_t first = end - 1;
    std::int64_t total = sizes[first];
    while (first > 0 && total + sizes[first - 1] <= bucket_elements) total += sizes[--first];
    out.push_back({first, end});
    end = first;
  }
  return out;
}

const std::vector<grad_bucket>& pipeline_plan::buckets_of(std::uint32_t s) const {
  static const std::vector<grad_bucket> none;
  return s < options.grad_buckets.size() ? options.grad_buckets[s] : none;
}

std::uint32_t pipeline_plan::grads_slots(std::uint32_t s) const {
  return std::max<std::uint32_t>(1, static_cast<std::uint32_t>(buckets_of(s).size()));
}

std::vector<int> stage_placement::peers() const {
  std::vector<int> out;
  for (int p : process)
    if (p != here && std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  std::sort(out.begin(), out.end());
  return out;
}

pipeline_plan make_plan(const pipeline_options& options, slot_table& slots, std::uint32_t first_step, int dp_rank,
                        int dp_size, stage_placement placement) {
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
  DSA_CHECK(!placement.split() || placement.process.size() == options.stages,
            "a placement of {} stages for a plan of {}", placement.process.size(), options.stages);
  bool any_here = !placement.split();
  for (std::uint32_t s = 0; s < placement.process.size(); ++s) any_here = any_here || placement.local(s);
  DSA_CHECK(any_here, "a placement that runs no stage in this process ({})", placement.here);
  plan.placement = std::move(placement);
  DSA_CHECK(options.grad_buckets.empty() || options.grad_buckets.size() == options.stages,
            "gradient buckets for {} stages in a plan of {}", options.grad_buckets.size(), options.stages);
  plan.feed_slots = feed_slots_for(options.stages);
  plan.input_edge = slots.add_edge("input", plan.feed_slots, 1);
  plan.labels_edge = slots.add_edge("labels", plan.feed_slots, 1);
  for (std::uint32_t s = 0; s + 1 < options.stages; ++s) {
    plan.activation_edges.push_back(slots.add_edge(fmt::format("activation {}", s), options.activation_slots, 1));
    plan.gradient_edges.push_back(slots.add_edge(fmt::format("gradient {}", s), options.gradient_slots, 1));
  }
  for (std::uint32_t s = 0; s < options.stages; ++s) {
    plan.grads_edges.push_back(slots.add_edge(fmt::format("grads {}", s), plan.grads_slots(s), 0));
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
