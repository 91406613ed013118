// The interfaces through which the runtime runs model, optimizer and data work.
// The runtime knows nothing about BERT or Adam: a stage runs a stage_compute,
// an optimizer shard runs an optimizer_compute, the feeder a batch_source.
// All calls for one object come from one worker thread at a time (never a CAF
// scheduler thread); implementations may block and may throw (the run then
// fails, naming the actor and step).
#pragma once

#include "core/tensor.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <vector>

namespace dsa::actors {

// Which micro-batch a call is for, and the stash slot holding what its forward
// saved for its backward (0 <= stash < the stash_slots given to reserve_stash).
struct work_key {
  std::uint32_t step = 0;
  std::uint32_t micro_batch = 0;
  std::uint32_t stash = 0;
};

class trace_recorder;

class stage_compute {
public:
  virtual ~stage_compute() = default;

  // Called once before the run: at most `slots` micro-batches are between forward and backward.
  virtual void reserve_stash(std::uint32_t slots) = 0;

  // in: the tensors of the input slot: [0] the micro-batch (first stage) or the
  //   previous stage's output, then any riders the previous stage passed on.
  // labels: defined on the last stage only.
  // out: the slot for the next stage (not on the last stage): [0] this stage's
  //   output, then riders, tensors a stage passes on for later stages in the
  //   same slot (BERT: the attention mask, which every layer needs). The slot's
  //   previous tensors are passed in and may be reused if their shapes fit.
  // Returns the micro-batch loss on the last stage, 0 elsewhere.
  virtual double forward(const work_key& key, const std::vector<tensor>& in, const tensor& labels,
                         std::vector<tensor>& out) = 0;
  // Called on the worker right after each forward: numbers about that micro-batch
  // whose meaning the model defines (accuracy counts, loss parts). The runtime
  // adds them up per step, element by element, on the last stage and reports the
  // sums with the step (step_summary::metrics), by message. None by default.
  virtual std::vector<double> forward_metrics() { return {}; }

  // grad_out: dLoss/d(output) from the next stage (undefined on the last stage).
  // grad_in: set to dLoss/d(input) (not needed on the first stage).
  // Accumulates (+=) parameter gradients over the step's micro-batches; frees the stash slot.
  virtual void backward(const work_key& key, const tensor& grad_out, tensor& grad_in) = 0;

  // Working parameters and their accumulated gradients, as views, in a fixed order.
  virtual std::vector<tensor> parameters() = 0;
  virtual std::vector<tensor> gradients() = 0;
  // The accumulated gradient of parameter `index` as the reducer reads it (what
  // gradients()[index] is), taken after the step's last backward, or during it
  // once the gradient is final (see set_gradients_final); it must not change the
  // other gradients.
  virtual tensor gradient(std::size_t index) { return gradients().at(index); }

  // Overlapping communication with backward (overlap_comm): before the step's
  // last backward the runtime installs a listener, and clears it (an empty
  // function) after. A compute that can tells it, during that backward, which
  // parameters' gradients are final for the step, as ranges [first, last) of
  // parameters() (each index once); the runtime then sends those buckets to the
  // reducer while the backward goes on. Calls come on the worker running the
  // backward. A compute that never calls it has its gradients sent after the backward.
  using gradients_final_fn = std::function<void(std::size_t first, std::size_t last)>;
  virtual void set_gradients_final(gradients_final_fn listener) { (void)listener; }
  // Installs a new parameter version (same order and shapes) and zeros the gradients.
  virtual void load_parameters(const std::vector<tensor>& updated) = 0;

  // A split-backward schedule (zero-bubble), said once before the run: from then on
  // backward() computes B (the input gradient and the cheap gradients) and keeps the
  // micro-batch's weight-gradient work for weight(key), which the runtime calls later, in
  // micro-batch order, with the same key. A compute that cannot split throws (the run's
  // config is refused before it gets here).
  virtual void split_backward() {
    throw std::runtime_error("this stage compute cannot split its backward into B and W (pipeline.schedule = \"zb\")");
  }
  virtual void weight(const work_key& key) {
    (void)key;
    throw std::runtime_error("this stage compute has no W work: it does not split its backward");
  }

  // For a compute that issues collectives of its own (ZeRO-3's parameter gathers): the
  // steps whose collectives may start. The runtime calls allow(first step) before the
  // run and, with several ranks, allow(k + 1) once the coordinators agreed to run step
  // k + 1 (after step k's hooks), so no rank starts a collective of a step its peers will
  // not run. cancel(): the run is ending; a call waiting for an allow (or for anything
  // else that will not come) must throw. Both may be called from any thread, while a
  // call of the worker is running. Nothing by default.
  virtual void allow(std::uint32_t step) { (void)step; }
  virtual void cancel() {}

  // Whether the compute sums its gradients over the data-parallel ranks itself (ZeRO-3,
  // each micro-batch's as the backward finishes it): gradient(i) then holds only the
  // elements [lo, hi) of the sum that the shard keeps (its gradient_parts()), and the
  // reducer copies them and adds the ranks' sums of squares instead of summing buckets.
  virtual bool gradients_reduced() const { return false; }

  // Tracing work of the compute's own beside its calls (a GPU stage's kernels, as device
  // spans): before the run the runtime hands it the run's recorder (null when not tracing),
  // its actor id and stage; after the run, when every worker has ended, null again (the
  // compute then forgets what it has not recorded). Nothing by default.
  virtual void trace_attach(trace_recorder* trace, std::uint32_t actor, std::int32_t stage) {
    (void)trace, (void)actor, (void)stage;
  }
};

// The step's gradient reductions as an optimizer shard receives them from its
// reducer (see reducer_actor.hpp).
struct grad_totals {
  // Sum of squares of the step's gradients: over every stage (a tied parameter
  // counted once) when `global`, else this stage's share only. Not finite when
  // some gradient is inf or nan.
  double sum_of_squares = 0;
  double own_sum_of_squares = 0; // this stage's share
  bool global = true;
};

// Elements [lo, hi) of a gradient in row-major order: the part of it an optimizer
// shard keeps (ZeRO stage 2). lo == hi: none of it.
struct gradient_part {
  std::int64_t lo = 0;
  std::int64_t hi = 0;
};

class optimizer_compute {
public:
  virtual ~optimizer_compute() = default;
  // Takes the stage's initial parameters (copies them into master state).
  virtual void init(const std::vector<tensor>& initial) = 0;
  // f32 buffers, one per parameter in the stage's order, that the reducer fills
  // with the step's reduced gradients before each update. Valid after init; the
  // same tensors for the whole run.
  virtual std::vector<tensor> gradient_buffers() = 0;
  // Gradient partitioning (ZeRO stage 2): empty (the default) when the shard keeps
  // every gradient whole, each buffer in its parameter's shape. Otherwise one part
  // per parameter, and gradient_buffers()[i] holds only elements [lo, hi) of gradient
  // i, as (hi - lo) f32 elements. The reducer still reads each gradient whole for
  // the sum of squares. A parameter whose gradient the reducer exchanges with another
  // stage (a tied one) must be kept whole. Valid after init; fixed for the run.
  virtual std::vector<gradient_part> gradient_parts() { return {}; }
  // Whether the reducer sums the next update's gradients over the data-parallel ranks
  // (true, the default) or leaves each rank its own (a compressed optimizer that exchanges
  // compressed state itself on such a step). The reducer reads it once the step is allowed,
  // which is after the shard's previous update: thread-safe, changed only by update().
  virtual bool sums_gradients() const { return true; }
  // Applies the update of `step` from gradient_buffers() and writes the new
  // working parameters into `out` (resized and allocated on first use).
  // Returns false when the step was skipped (parameters unchanged, e.g. an fp16 overflow).
  virtual bool update(std::uint32_t step, const grad_totals& totals, std::vector<tensor>& out) = 0;
  // Speculation (pipeline.speculative_update): the buffers of `step` are final but its
  // totals are not known yet. The shard may start the update assuming no clipping and
  // no overflow, keeping what it needs to roll back; update() of the same step, next
  // call, then keeps it or rolls back and redoes it, with the same result bit for bit
  // as without speculation. Called only when update() could run (the stage released
  // the previous version, the step is allowed). Returns false when it did not
  // speculate (the default).
  virtual bool speculate(std::uint32_t step) {
    (void)step;
    return false;
  }
  // Streaming the update over the backward (an update whose decision does not wait for
  // the step's totals, on state that moves chunk by chunk): > 0 when the shard can update
  // part of its state as soon as the gradients there are final; the runtime then
  // publishes the stage's gradients in buckets of about this many elements as the
  // backward finishes them, the reducer tells the shard of each (reduced_part), and the
  // shard calls, for each step: gradients_final(step, first) on its own thread as the
  // parts arrive (thread-safe: the gradients of the stage's parameters from `first` on
  // are final in gradient_buffers(); first decreases to 0); stream_update(step) on the
  // worker once update() could run, which updates as parts become final and returns once
  // every part is updated, returning true (or false at once, declining to stream the step); then
  // update() of the step, which decides, keeps or redoes the streamed update, and
  // publishes. cancel(): the run is ending, a stream_update waiting for parts must throw
  // (any thread). 0 by default: no streaming.
  virtual std::int64_t stream_elements() const { return 0; }
  virtual void gradients_final(std::uint32_t step, std::uint32_t first) { (void)step, (void)first; }
  virtual bool stream_update(std::uint32_t step) {
    (void)step;
    return false;
  }
  virtual void cancel() {}
  // Tracing work of the shard's own besides update() (its NVMe swap transfers): before
  // the run, and before init(), the runtime hands it the run's recorder (null when not
  // tracing) and its actor id and stage. trace_detach(): the shard waits for that work,
  // records what is still unrecorded and forgets the recorder; called on the worker right
  // after the plan's last update (so it reaches the trace file), and again by the runtime
  // after the run (a run stopped early: its records reach the in-memory trace only).
  // Nothing by default.
  virtual void trace_attach(trace_recorder* trace, std::uint32_t actor, std::int32_t stage) {
    (void)trace, (void)actor, (void)stage;
  }
  virtual void trace_detach() {}
};

class batch_source {
public:
  virtual ~batch_source() = default;
  // Fills the first stage's input and the last stage's labels of (step, micro_batch);
  // tensors from the previous use of the slot are passed in for reuse.
  virtual void fill(std::uint32_t step, std::uint32_t micro_batch, tensor& input, tensor& labels) = 0;
  // Where the source stands after the last fill: numbers a checkpoint stores to
  // resume the data stream (opaque to the runtime). Called on the feeder's
  // worker right after a step's last fill; the feeder sends it to the
  // coordinator (data_position), which hands it to the step hooks. None by default.
  virtual std::vector<std::uint64_t> position() const { return {}; }
};

} // namespace dsa::actors
