// Running stage work; see stage_runner.hpp.
#include "actors/stage_runner.hpp"

#include "core/test_fault.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace dsa::actors {

stage_edges stage_edges_of(const pipeline_plan& plan, std::uint32_t stage) {
  const std::uint32_t S = plan.options.stages;
  stage_edges e;
  e.input = stage == 0 ? plan.input_edge : plan.activation_edges[stage - 1];
  if (stage + 1 == S) {
    e.labels = plan.labels_edge;
  } else {
    e.output = plan.activation_edges[stage];
    e.grad_in = plan.gradient_edges[stage];
  }
  if (stage > 0) e.grad_out = plan.gradient_edges[stage - 1];
  e.grads = plan.grads_edges[stage];
  e.params = plan.params_edges[stage];
  return e;
}

stage_runner::stage_runner(std::shared_ptr<slot_table> slots, stage_edges edges, stage_compute* compute,
                           trace_recorder* trace, std::uint32_t actor, std::uint32_t stage,
                           std::vector<grad_bucket> buckets, bool overlap)
    : slots_(std::move(slots)), edges_(edges), compute_(compute), trace_(trace), actor_(actor), stage_(stage),
      buckets_(std::move(buckets)), overlap_(overlap) {
  if (buckets_.empty()) buckets_.push_back({0, static_cast<std::uint32_t>(compute_->parameters().size())});
}

work_done stage_runner::run(const stage_work& w) {
  work_done done{static_cast<std::uint32_t>(w.kind), w.step, w.micro_batch, 0.0, {}, {}};
  const work_key key{w.step, w.micro_batch, w.stash_slot};
  const auto stage = static_cast<std::int32_t>(stage_);
  static const tensor undefined;
  switch (w.kind) {
    case work_kind::forward: {
      test_fault::at(test_fault::phase::forward, w.step);
      trace_span span(trace_, trace_name::forward, actor_, stage, w.step, w.micro_batch);
      const slot_contents& in = slots_->at({edges_.input, w.in_slot});
      const tensor& labels =
          edges_.labels == stage_edges::none ? undefined : slots_->at({edges_.labels, w.labels_slot})[0];
      slot_contents scratch;
      slot_contents& out = edges_.output == stage_edges::none ? scratch : slots_->at({edges_.output, w.out_slot});
      done.value = compute_->forward(key, in, labels, out);
      done.metrics = compute_->forward_metrics();
      break;
    }
    case work_kind::backward: {
      trace_span span(trace_, trace_name::backward, actor_, stage, w.step, w.micro_batch);
      const tensor& grad_out =
          edges_.grad_in == stage_edges::none ? undefined : slots_->at({edges_.grad_in, w.in_slot})[0];
      tensor scratch;
      tensor& grad_in =
          edges_.grad_out == stage_edges::none ? scratch : slots_->at({edges_.grad_out, w.out_slot})[0];
      if (w.last_of_step) backward_publishing(key, grad_out, grad_in);
      else compute_->backward(key, grad_out, grad_in);
      break;
    }
    case work_kind::load: {
      trace_span span(trace_, trace_name::load, actor_, stage, w.step, 0);
      compute_->load_parameters(slots_->at({edges_.params, w.in_slot}));
      break;
    }
    case work_kind::weight: {
      // The split backward's W (zero-bubble); the step's last one publishes every bucket, in order.
      trace_span span(trace_, trace_name::weight, actor_, stage, w.step, w.micro_batch);
      compute_->weight(key);
      if (w.last_of_step)
        for (std::uint32_t b = 0; b < buckets_.size(); ++b) publish(key.step, b);
      break;
    }
  }
  return done;
}

void stage_runner::publish(std::uint32_t step, std::uint32_t bucket) {
  const grad_bucket& b = buckets_[bucket];
  slot_contents& slot = slots_->at({edges_.grads, bucket});
  slot.clear();
  for (std::uint32_t i = b.first; i < b.last; ++i) slot.push_back(compute_->gradient(i));
  if (sender_) sender_(step, bucket);
}

void stage_runner::backward_publishing(const work_key& key, const tensor& grad_out, tensor& grad_in) {
  std::uint32_t params = 0;
  for (const auto& b : buckets_) params = std::max(params, b.last);
  std::vector<bool> final_grad(params, false);
  std::uint32_t next = 0; // the next bucket to publish: buckets go out in order
  auto publish_ready = [&] {
    while (next < buckets_.size()) {
      const grad_bucket& b = buckets_[next];
      for (std::uint32_t i = b.first; i < b.last; ++i)
        if (!final_grad[i]) return;
      publish(key.step, next++);
    }
  };
  if (overlap_ && buckets_.size() > 1) {
    compute_->set_gradients_final([&](std::size_t first, std::size_t last) {
      for (std::size_t i = first; i < last && i < final_grad.size(); ++i) final_grad[i] = true;
      publish_ready();
    });
  }
  struct clear_listener {
    stage_compute* compute;
    bool set;
    ~clear_listener() {
      if (set) compute->set_gradients_final({});
    }
  } clear{compute_, overlap_ && buckets_.size() > 1};
  compute_->backward(key, grad_out, grad_in);
  while (next < buckets_.size()) publish(key.step, next++);
}

} // namespace dsa::actors
