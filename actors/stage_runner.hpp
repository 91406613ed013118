// Runs one stage_work item against the slot table and the stage's compute:
// resolves the slots, calls forward / backward / load_parameters, records the
// compute span. Plain C++ (no CAF); called only from the stage's worker thread.
#pragma once

#include "actors/compute.hpp"
#include "actors/plan.hpp"
#include "actors/protocol/messages.hpp"
#include "actors/stage_scheduler.hpp"
#include "actors/trace/trace_recorder.hpp"

#include <memory>

namespace dsa::actors {

// The edges a stage reads and writes; `none` where the stage has no such edge.
struct stage_edges {
  static constexpr std::uint32_t none = ~0u;
  std::uint32_t input = none;    // activation (or micro-batch) in
  std::uint32_t labels = none;   // last stage only
  std::uint32_t output = none;   // activation out (not on the last stage)
  std::uint32_t grad_in = none;  // gradient from the next stage (not on the last stage)
  std::uint32_t grad_out = none; // gradient to the previous stage (not on the first stage)
  std::uint32_t grads = none;    // accumulated gradients to the stage's reducer
  std::uint32_t params = none;   // parameter versions from the optimizer shard
};
stage_edges stage_edges_of(const pipeline_plan& plan, std::uint32_t stage);

class stage_runner {
public:
  stage_runner(std::shared_ptr<slot_table> slots, stage_edges edges, stage_compute* compute,
               trace_recorder* trace, std::uint32_t actor, std::uint32_t stage);

  work_done run(const stage_work& work);
  // Puts views of the accumulated gradients into the grads slot (after the step's last backward).
  void publish_gradients();

private:
  std::shared_ptr<slot_table> slots_;
  stage_edges edges_;
  stage_compute* compute_;
  trace_recorder* trace_;
  std::uint32_t actor_, stage_;
};

} // namespace dsa::actors
