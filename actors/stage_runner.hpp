// Runs one stage_work item against the slot table and the stage's compute:
// resolves the slots, calls forward / backward / load_parameters, records the
// compute span. Plain C++ (no CAF); called only from the stage's worker thread.
#pragma once

#include "actors/compute.hpp"
#include "actors/plan.hpp"
#include "actors/protocol/messages.hpp"
#include "actors/stage_scheduler.hpp"
#include "actors/trace/trace_recorder.hpp"

#include <functional>
#include <memory>
#include <vector>

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

// Called on the worker when bucket `bucket` of `step`'s gradients is in its slot
// of the grads edge; the stage actor then sends `produced` for it (grads_ready).
using bucket_sender = std::function<void(std::uint32_t step, std::uint32_t bucket)>;

class stage_runner {
public:
  // buckets: the stage's gradient buckets in publish order (empty: one of all
  // parameters). overlap: listen for final gradients during the step's last
  // backward and send each bucket as soon as all its parameters are final.
  stage_runner(std::shared_ptr<slot_table> slots, stage_edges edges, stage_compute* compute,
               trace_recorder* trace, std::uint32_t actor, std::uint32_t stage, std::vector<grad_bucket> buckets = {},
               bool overlap = false);
  void set_sender(bucket_sender sender) { sender_ = std::move(sender); }

  work_done run(const stage_work& work);

private:
  // The step's last backward with its buckets published: those whose
  // parameters are all final while it runs (with overlap), the rest after it, in
  // bucket order.
  void backward_publishing(const work_key& key, const tensor& grad_out, tensor& grad_in);
  // Puts views of bucket b's gradients into its slot and hands it to the sender.
  void publish(std::uint32_t step, std::uint32_t bucket);

  std::shared_ptr<slot_table> slots_;
  stage_edges edges_;
  stage_compute* compute_;
  trace_recorder* trace_;
  std::uint32_t actor_, stage_;
  std::vector<grad_bucket> buckets_;
  bool overlap_;
  bucket_sender sender_;
};

} // namespace dsa::actors
