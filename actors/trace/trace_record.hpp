// One fixed-size (64-byte) trace record: a compute span or a message edge.
// This layout is the record of the binary trace format (trace_file.hpp).
#pragma once

#include <cstdint>
#include <type_traits>

namespace dsa::actors {

enum class trace_kind : std::uint8_t {
  span = 0, // [t0, t1] of compute on the actor's worker
  send = 1, // a message left the actor at t0
  recv = 2, // a message was handled by the actor at t0
};

// Names of spans and messages; the file stores the strings, so readers need not know this enum.
enum class trace_name : std::uint16_t {
  forward = 0,
  backward = 1,
  optimizer = 2,
  load = 3,
  produced = 4,
  released = 5,
  step_report = 6,
  update_report = 7,
  reduce = 8,       // a reducer's compute (gather, tied sum or copy)
  grad_partial = 9, // a reducer's share of the gradient norm, to another reducer
  allreduce = 10,   // a reducer's sum of one gradient bucket over the data-parallel ranks (micro_batch: the bucket)
  // An optimizer shard's NVMe swap of one chunk of its state (micro_batch: the chunk, bytes:
  // over its arrays), from the first request submitted to the last ended; on the aio engine,
  // so they overlap the shard's other spans (actors/train/shard/swap_tracer.hpp).
  swap_read = 11,
  swap_write = 12,
  // An optimizer shard's speculative update (pipeline.speculative_update): started before
  // the step's totals, overlapping the norm exchange; the `optimizer` span that follows
  // keeps or redoes it.
  speculate = 13,
  // An optimizer shard's streamed update (optimizer_compute::stream_elements): chunks of
  // its state updated as the reducer hands over the gradients the backward finished; the
  // `optimizer` span that follows only publishes the version.
  stream_update = 14,
  // An optimizer shard's update of one chunk of its NVMe-swapped state (micro_batch: the
  // chunk), inside its optimizer or stream_update span; beside the worker's spans like the
  // transfers, so swap_read of the next chunk is seen during it (actors/train/shard/swap_tracer.hpp).
  swap_update = 15,
  // A CUDA stage's kernels of one forward or backward (micro_batch: the micro-batch), timed
  // by CUDA events on its stream and placed on the recorder's clock at the stage's next
  // wait for the device; beside the worker's spans, on a device row.
  gpu_forward = 16,
  gpu_backward = 17,
  // A stage's deferred weight gradients of one micro-batch (pipeline.schedule = "zb": the W
  // half of its split backward, the B half being its backward span).
  weight = 18,
  count_ = 19,
};
const char* trace_name_string(trace_name name);

struct trace_record {
  std::uint64_t t0_ns = 0; // since the recorder's origin (steady clock)
  std::uint64_t t1_ns = 0; // spans only
  std::uint64_t bytes = 0; // messages: payload bytes in the referenced slot
  std::uint64_t flow = 0;  // messages: same value on send and recv (see flow_id)
  std::uint32_t step = 0;
  std::uint32_t micro_batch = 0;
  std::uint32_t actor = 0; // actor id of the plan
  std::uint32_t peer = 0;  // messages: the other actor
  std::uint32_t edge = 0;
  std::uint32_t slot = 0;
  std::int32_t stage = -1; // -1 when not a stage's record
  std::uint16_t name = 0;  // trace_name
  std::uint8_t kind = 0;   // trace_kind
  std::uint8_t reserved = 0;
};
static_assert(sizeof(trace_record) == 64, "the file format fixes 64-byte records");
static_assert(std::is_trivially_copyable<trace_record>::value, "records are written as bytes");

// Flow id linking a send to its receive: (name, edge, seq) identify one message.
inline std::uint64_t flow_id(trace_name name, std::uint32_t edge, std::uint64_t seq) {
  return (static_cast<std::uint64_t>(name) << 56) | (static_cast<std::uint64_t>(edge & 0xffffu) << 40) |
         (seq & ((1ull << 40) - 1));
}

} // namespace dsa::actors
