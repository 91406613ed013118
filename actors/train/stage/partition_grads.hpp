// ZeRO stage 3's gradient partition for one pipeline stage of one data-parallel rank:
// each micro-batch's gradient of a tensor, as soon as the backward has finished it, is
// summed over the ranks and only this rank's elements of the sum (its partition of the
// stage's flat layout) are added into an f32 accumulator of partition_numel elements;
// the whole gradient is then freed. So the stage never holds the whole model's
// gradients, only those of the parts in flight (DeepSpeed's stage 3 reduce-scatters each
// micro-batch's gradients into the partition the same way).
//
// The sums run on a thread of this object's own, in the order the tensors were handed
// in (every rank runs the same backward sequence, so every rank issues the same
// allreduces in the same order), overlapping the rest of the backward; at most
// `pending_elements` wait (DeepSpeed's reduce_bucket_size), beyond which submit blocks.
// Each micro-batch's gradient is first rounded to the working precision (what a half
// gradient would carry), summed in fp32 over the ranks, and accumulated in fp32 over the
// micro-batches in micro-batch order: the same on every rank, but not stage 0's order
// (which accumulates each rank's micro-batches first and sums over ranks once).
#pragma once

#include "core/error.hpp"
#include "core/file_backed.hpp"
#include "core/tensor.hpp"
#include "io/net/comms_logger.hpp"
#include "io/net/communicator.hpp"
#include "optim/flat_layout.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dsa::train {

class partition_grads {
public:
  // logger (may be null): comms_logger, each sum an "all_reduce" by `caller`.
  // accumulator: undefined (the partition in memory, pages untouched until written), or
  // (partition_numel) f32 zeros in a file (core/file_backed.hpp: the gradient partition on
  // NVMe), through which each sum is added a window at a time and paged out.
  partition_grads(optim::flat_layout layout, std::uint32_t rank, dtype working, std::shared_ptr<net::communicator> comm,
                  std::int64_t pending_elements, net::comms_logger* logger = nullptr, std::string caller = {},
                  tensor accumulator = {});
  ~partition_grads();
  partition_grads(const partition_grads&) = delete;
  partition_grads& operator=(const partition_grads&) = delete;

  // Tensor t's gradient of one micro-batch of `step` (f32, the tensor's elements): summed
  // over the ranks and its partition elements added in; taken over (freed after the sum).
  // Waits until the step is allowed (its sums are collectives). Throws after a failed sum
  // or cancel().
  void submit(std::size_t t, tensor grad, std::uint32_t step);
  // Steps up to `step` may sum (every rank will run them); any thread.
  void allow(std::uint32_t step);
  // Waits until every submitted gradient is summed and added; throws on a failure.
  void wait();
  // Zeros the accumulator (a new step). Only when nothing is pending.
  void reset();
  // The run ends: waiting callers throw.
  void cancel();

  // (partition_numel) f32: this rank's partition of the step's summed gradients (after wait).
  const tensor& partition() const { return partition_; }
  // Tensor t's elements in the partition, as a 1-D view of partition() (0 elements when
  // the rank owns none of it), and which elements of t they are.
  tensor piece_of(std::size_t t) const;
  std::int64_t piece_offset(std::size_t t) const { return pieces_[t].tensor_offset; }
  // The bytes it keeps in memory: the partition, or with it in a file the windows that
  // are resident at once at most (the sums' and one reader's).
  std::int64_t bytes() const {
    const auto whole = static_cast<std::int64_t>(partition_.nbytes());
    return in_file_ ? std::min<std::int64_t>(whole, 2 * file_backed_window_bytes()) : whole;
  }
  // Whether the partition lives in a file (then at most a window of it is resident per pass).
  bool in_file() const { return in_file_; }

private:
  void run_thread();
  status reduce(std::size_t t, tensor& grad);

  optim::flat_layout layout_;
  std::uint32_t rank_ = 0;
  dtype working_ = dtype::f32;
  std::shared_ptr<net::communicator> comm_;
  std::int64_t pending_limit_ = 0;
  net::comms_logger* logger_ = nullptr;
  std::string caller_;
  tensor partition_;
  bool in_file_ = false;
  std::vector<optim::flat_piece> pieces_; // per tensor: its piece in this rank's partition (count 0: none)

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::size_t, tensor>> queue_;
  std::int64_t pending_ = 0; // elements queued or being summed
  bool busy_ = false;
  bool stop_ = false, cancelled_ = false;
  std::int64_t allowed_ = -1;
  std::optional<error> failed_;
  std::thread thread_;
};

} // namespace dsa::train
