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
#include "models/bert/bert_config.hpp"
#include "models/bert/bert_parameters.hpp"
#include "models/bert/bert_range.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace dsa::train {

// Shared by the stages of a run: the compute-time counters (wall_clock_breakdown).
struct stage_shared {
  // Compute time summed over stages (wall_clock_breakdown), in nanoseconds.
  std::atomic<std::int64_t> forward_ns{0}, backward_ns{0}, optimizer_ns{0};
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
  // Rank r of R counts its micro-batches from r x M in the dropout streams, so each
  // global micro-batch draws the masks it would draw on one rank.
  std::uint32_t micro_batch_offset = 0;
  // ZeRO-3, and ZeRO-2 on one pipeline stage: the stage's gradients are summed into a
  // partition part by part (enable_partitioned_grads), so no whole gradient buffers.
  bool whole_gradients = true;
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

// The device a run's stages compute on. The one place that picks a stage's class.
enum class stage_device { cpu };

std::unique_ptr<model_stage> make_stage(stage_device device, const stage_options& options, stage_shared& shared);

} // namespace dsa::train
