// The asynchronous collectives (async_collectives.hpp) over NCCL: device buffers, every
// operation enqueued on one communication stream (NCCL orders them there, so they complete
// in ticket order), and a wait that polls NCCL's asynchronous error, the stream's completion
// and a deadline (nccl::communicator::wait): an error or the deadline aborts the
// communicator, which breaks the group for good. What the reducer of a GPU rank is to use
// for buckets that live on the device; built and tested on every machine against the fake
// NCCL (tests/net/test_nccl.cpp), the stream's completion then the fake's. An operation
// refused on enqueue (an element type NCCL does not sum, NCCL's own refusal) breaks the
// group as a failed one does. After a failure a wait returns the error at once (the kernels
// the abort stopped may still be on the stream: a caller that frees device buffers then
// synchronises the stream first); a ticket counts as complete once a wait saw it complete.
#pragma once

#include "io/net/async_collectives.hpp"
#include "io/net/nccl.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <optional>

namespace dsa::net {

class nccl_collectives final : public async_collectives {
public:
  // `stream_done`: whether every operation enqueued on `stream` so far has completed (a CUDA
  // build passes cudaStreamQuery(stream) == cudaSuccess). `deadline`: how long one wait may
  // take before the group is taken for lost.
  nccl_collectives(std::unique_ptr<nccl::communicator> comm, nccl::stream_t stream, std::function<bool()> stream_done,
                   std::chrono::milliseconds deadline = std::chrono::minutes(5),
                   std::chrono::microseconds poll = std::chrono::microseconds(200), nccl::clock_fn clock = {});

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  buffer_memory memory() const override { return buffer_memory::device; }
  // f32, f16 or bf16 (NCCL sums in the element type).
  expected<ticket> all_reduce_sum(void* data, dtype type, std::int64_t count) override;
  // Any element type: NCCL's own where it has one (u8, i64, f16, f32, bf16), else the bytes.
  expected<ticket> all_gather(void* out, const void* in, dtype type, std::int64_t count) override;
  // Waits for the stream (so for every ticket handed out so far, not only `t`).
  status wait(ticket t) override;

private:
  expected<ticket> issued(status s);

  std::unique_ptr<nccl::communicator> comm_;
  nccl::stream_t stream_;
  std::function<bool()> stream_done_;
  std::chrono::milliseconds deadline_;
  std::chrono::microseconds poll_;
  nccl::clock_fn clock_;
  ticket next_ = 1;     // the next ticket handed out
  ticket finished_ = 0; // every ticket up to this one has completed
  std::optional<error> failure_;
};

} // namespace dsa::net
