// Where a GPU-resident optimizer shard (device_shard.hpp) keeps its state: per parameter
// an f32 master, Adam's two moments and, with half storage, the working copy the fused
// step writes in the same pass. The shard decides (skip, unscale and clip, lr) on the host
// as every mode does; the device holds the arrays and runs the element rule of
// kernels/common/adam_math.hpp. Two of them: the CUDA one (a CUDA rank without
// offload_optimizer, make_cuda_optimizer_device) and the host one, the same arithmetic on
// the CPU (cpu::adam_update), which makes the mode testable on every machine against
// whole_shard, bit for bit. Calls come from the shard's worker only.
#pragma once

#include "core/tensor.hpp"
#include "kernels/cpu/adam.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace dsa::train {

class optimizer_device {
public:
  virtual ~optimizer_device() = default;
  // Adds the next parameter: its f32 master; its moments (f32 of the master's size) or
  // undefined for zeros. With a half working type its working copy is cast from the master.
  virtual void add(const tensor& master, const tensor& m, const tensor& v) = 0;
  // One Adam or AdamW step of parameter i from `grad` (host f32, already unscaled and
  // clipped), the working copy written in the same pass.
  virtual void step(std::size_t i, const tensor& grad, const cpu::adam_params& params) = 0;
  // Host copies, started here and complete after wait_reads(): the version's tensor (the
  // working copy, or the master in f32) into `out`, reallocated unless it has the shape and
  // type; the master and the moments, likewise.
  virtual void read_version(std::size_t i, tensor& out) = 0;
  virtual void read_state(std::size_t i, tensor& master, tensor& m, tensor& v) = 0;
  // Waits (once) for every host copy started so far.
  virtual void wait_reads() = 0;
  // Overwrites the master and moments of parameter i (and casts the working copy again).
  virtual void write_state(std::size_t i, const tensor& master, const tensor& m, const tensor& v) = 0;
  // Bytes held there (masters, moments, working copies, scratch).
  virtual std::int64_t bytes() const = 0;
  // "cuda:0", or "host" (for the log and the errors).
  virtual std::string where() const = 0;
};

// The host one: tensors in this process's memory, stepped by cpu::adam_update.
std::unique_ptr<optimizer_device> make_host_optimizer_device(dtype working);
// The CUDA one on device `index` (CUDA builds only; make_shard's callers reach it through
// a CUDA rank's device_choice).
std::unique_ptr<optimizer_device> make_cuda_optimizer_device(int index, dtype working);

} // namespace dsa::train
