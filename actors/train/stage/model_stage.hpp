// What `dsactor run` needs of a pipeline stage beyond the runtime's stage_compute: the
// model range's named parameters (initialised, loaded from and saved to checkpoints, read
// by the evaluation and the memory accounting), the loss scale, and ZeRO's hooks. The run
// holds its stages as model_stage only; make_stage is the one place a device's stage is
// chosen (bert_stage on the CPU; a CUDA stage implements this interface too).
#pragma once

#include "actors/compute.hpp"
#include "actors/train/config/precision.hpp"
#include "actors/train/stage/partition_grads.hpp"
#include "actors/train/stage/param_fetcher.hpp"
#include "models/bert/bert_batch.hpp"
#include "models/bert/bert_config.hpp"
#include "models/bert/bert_parameters.hpp"
#include "models/bert/bert_range.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace dsa::train {

// Shared by the stages of a run: the compute-time counters (wall_clock_breakdown).
// Forward and backward time count per step: the next step's forwards may run before this
// step's figures are taken (its report waits for the step hooks), so one counter would hand
// them to the wrong row. The optimizer's is one counter: step k + 1's update waits for step
// k's hooks.
class stage_shared {
public:
  enum class phase { forward = 0, backward = 1 };
  std::atomic<std::int64_t> optimizer_ns{0}; // summed over stages, in nanoseconds

  void add(std::uint32_t step, phase p, std::int64_t ns) {
    std::lock_guard<std::mutex> lk(mu_);
    slot& s = ring_[step % ring_.size()];
    if (s.step != step) s = slot{step, {0, 0}}; // a step never taken (a run's end) gives way
    s.ns[static_cast<int>(p)] += ns;
  }
  // Step `step`'s forward and backward nanoseconds, cleared.
  std::array<std::int64_t, 2> take(std::uint32_t step) {
    std::lock_guard<std::mutex> lk(mu_);
    slot& s = ring_[step % ring_.size()];
    if (s.step != step) return {0, 0};
    const auto out = s.ns;
    s = slot{};
    return out;
  }

private:
  struct slot {
    std::uint32_t step = ~0u;
    std::array<std::int64_t, 2> ns{0, 0};
  };
  std::mutex mu_;
  std::array<slot, 8> ring_{}; // steps in flight at once: two
};

// Step `step`'s figures in milliseconds (forward, backward, optimizer), each taken once.
inline std::vector<double> take_stage_times(stage_shared& shared, std::uint32_t step) {
  const auto ns = shared.take(step);
  return {static_cast<double>(ns[0]) / 1e6, static_cast<double>(ns[1]) / 1e6,
          static_cast<double>(shared.optimizer_ns.exchange(0)) / 1e6};
}

// Adds the time from its construction to its destruction to one step's counter.
struct stage_timer {
  stage_shared& shared;
  std::uint32_t step;
  stage_shared::phase phase;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  ~stage_timer() {
    shared.add(step, phase,
               std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  }
};

struct stage_options {
  bert::bert_config model;
  bert::bert_range range;
  // The head's loss gradient is scaled by 1/micro_batches: M, or M x R with R
  // data-parallel ranks (the summed gradients are then the global batch's mean).
  std::uint32_t micro_batches = 1;
  precision working = precision::f32;
  std::uint64_t seed = 0; // dropout streams
  std::int64_t fail_step = -1; // testing: forward of this step throws
  std::int64_t overflow_step = -1; // testing: the first gradient of this step is +inf (debug.overflow_step)
  // Rank r of R counts its micro-batches from r x M in the dropout streams, so each
  // global micro-batch draws the masks it would draw on one rank.
  std::uint32_t micro_batch_offset = 0;
  // ZeRO-3, and ZeRO-2 on one pipeline stage: the stage's gradients are summed into a
  // partition part by part (enable_partitioned_grads), so no whole gradient buffers.
  bool whole_gradients = true;
  int device_index = -1; // the CUDA device of a stage_device::cuda stage
  // Stages across processes: the stage that reads this stage's output (the next) or its
  // input gradient (the previous) runs in another process, so a CUDA stage writes that
  // slot as a host tensor (only host tensors travel: pipe_link.hpp). A CPU stage's slots
  // are host tensors anyway.
  bool output_leaves_process = false;
  bool grad_in_leaves_process = false;
  // A CPU stage's whole weights made by this instead of in memory (bert_parameters'
  // value_maker): ZeRO-3 with its weights on NVMe builds them in a file, a tensor resident at
  // a time, before they are partitioned into the store.
  bert::bert_parameters::value_maker make_value{};
  bool deterministic = false; // devices.deterministic: a CUDA stage's ordered sums
  std::int64_t planned_device_bytes = 0; // its model states there (named by an out-of-memory stop)
  // ZeRO-3 on a CUDA stage: parts whose weights may be bound on the device at once (the
  // device plan's window, cuda_zero3.hpp).
  std::size_t zero3_device_window = 1;
};

class model_stage : public actors::stage_compute {
public:
  // The range's parameters by HuggingFace name, values in the working precision. Valid
  // between steps (never while the stage's worker runs one); with ZeRO-3 only after
  // gather_whole (the values are the fetcher's between them).
  virtual bert::bert_parameters& named_parameters() = 0;

  // The loss scale the head's backward applies: set before the run (the resumed or
  // initial scale), then by each parameter version. Read and written on the worker only.
  virtual double& loss_scale() = 0;

  // ZeRO stage 3: from the first forward on the stage holds only its partition of the
  // working weights in `fetcher` and sums its gradients into `grads`' partition.
  virtual void enable_zero3(std::shared_ptr<param_fetcher> fetcher, std::shared_ptr<partition_grads> grads) = 0;
  // ZeRO stage 2 on one pipeline stage: the same gradient partition, weights whole.
  virtual void enable_partitioned_grads(std::shared_ptr<partition_grads> grads) = 0;
  // The parts and their order as ZeRO-3's fetcher needs them (param_fetcher.hpp).
  virtual std::vector<fetch_part> fetch_parts() const = 0;
  virtual std::vector<std::int64_t> fetch_sequence() const = 0;
  // ZeRO-3, after the run, on every rank at once: the whole working weights gathered back
  // into the stage (for the evaluation). Nothing without ZeRO-3.
  virtual void gather_whole() = 0;
  virtual const param_fetcher* fetcher() const = 0;
  // ZeRO-3: the gradient partition's bytes (0 otherwise).
  virtual std::int64_t partition_grad_bytes() const = 0;
};

// The device a run's stages compute on. The one place that picks a stage's class:
// bert_stage on the CPU, cuda_stage (CUDA builds) on a GPU.
enum class stage_device { cpu, cuda };

std::unique_ptr<model_stage> make_stage(stage_device device, const stage_options& options, stage_shared& shared);

// A whole parameter version as a shard publishes it (every tensor of `params` in its order,
// f32, f16 or bf16, then the loss scale) cast into params' values; returns the loss scale.
// Throws naming the tensor that does not fit: the version comes from another actor (later,
// another process), so a mismatch fails the stage's load job by name.
double load_version(bert::bert_parameters& params, const std::vector<tensor>& updated);
// A ZeRO-3 version (this rank's partition of the working weights, then the loss scale):
// checked, its scale returned; throws naming what is wrong.
double zero3_version_scale(const std::vector<tensor>& updated);

// A forward's slot as every stage class reads it: the first stage unpacks the micro-batch
// into `batch`; later stages get the hidden states (returned as they came, in the working
// precision) and, riding beside them, the f32 attention mask; the stage with the head also
// unpacks the labels. Throws naming a malformed slot.
tensor read_slot(const bert::bert_range& range, bert::head_kind head, const std::vector<tensor>& in,
                 const tensor& labels, bert::bert_batch& batch);

// debug.overflow_step: gradient `index` of `step`, as handed to the reducer, made to
// overflow (its first element +inf) when `step` is options.overflow_step and it is the
// stage's first gradient.
void inject_overflow(const stage_options& options, std::uint32_t step, std::size_t index, tensor& gradient);

} // namespace dsa::train
