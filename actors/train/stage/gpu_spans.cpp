// See gpu_spans.hpp.
#include "actors/train/stage/gpu_spans.hpp"

#include "core/device_waits.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dsa::train {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(fmt::format("CUDA stage trace: {} failed: {}", what, cudaGetErrorString(e)));
}

} // namespace

gpu_spans::~gpu_spans() {
  drop_pending();
  if (anchor_ && anchor_->event) cudaEventDestroy(anchor_->event);
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

void gpu_spans::attach(actors::trace_recorder* trace, std::uint32_t actor, std::int32_t stage) {
  if (!trace) drop_pending();
  trace_ = trace;
  actor_ = actor;
  stage_ = stage;
}

cudaEvent_t gpu_spans::take_event() {
  if (!free_.empty()) {
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  check(cudaEventCreate(&e), "cudaEventCreate");
  return e;
}

void gpu_spans::give_back(cudaEvent_t e) { free_.push_back(e); }

void gpu_spans::drop_pending() {
  for (const pending& p : pending_) {
    give_back(p.start);
    give_back(p.stop);
  }
  pending_.clear();
}

void gpu_spans::new_anchor(cudaStream_t stream) {
  auto a = std::make_shared<anchor>();
  a->event = take_event();
  check(cudaEventRecord(a->event, stream), "recording the trace's anchor");
  device_wait("cudaEventSynchronize (the trace's anchor on an idle stream)");
  check(cudaEventSynchronize(a->event), "the trace's anchor");
  a->host_ns = trace_->now_ns();
  anchor_ = std::move(a);
}

void gpu_spans::begin(cudaStream_t stream, actors::trace_name name, std::uint32_t step, std::uint32_t micro_batch) {
  if (!trace_) return;
  if (!anchor_) new_anchor(stream);
  pending p;
  p.name = name;
  p.step = step;
  p.micro_batch = micro_batch;
  p.start = take_event();
  p.stop = take_event();
  p.from = anchor_;
  check(cudaEventRecord(p.start, stream), "recording a span's start");
  pending_.push_back(p);
}

void gpu_spans::end(cudaStream_t stream) {
  if (!trace_ || pending_.empty()) return;
  check(cudaEventRecord(pending_.back().stop, stream), "recording a span's end");
}

void gpu_spans::after_wait(cudaStream_t stream) {
  if (!trace_) return;
  // The new anchor first: its synchronize finds every event queued before it complete (the
  // stage's wait left at most the span's end event after what it waited for).
  const std::shared_ptr<anchor> previous = anchor_;
  new_anchor(stream);
  for (const pending& p : pending_) {
    float t0 = 0, t1 = 0;
    check(cudaEventElapsedTime(&t0, p.from->event, p.start), "a span's start time");
    check(cudaEventElapsedTime(&t1, p.from->event, p.stop), "a span's end time");
    actors::trace_record r;
    r.t0_ns = p.from->host_ns + static_cast<std::uint64_t>(static_cast<double>(t0) * 1e6);
    r.t1_ns = p.from->host_ns + static_cast<std::uint64_t>(static_cast<double>(t1) * 1e6);
    r.step = p.step;
    r.micro_batch = p.micro_batch;
    r.actor = actor_;
    r.stage = stage_;
    r.name = static_cast<std::uint16_t>(p.name);
    r.kind = static_cast<std::uint8_t>(actors::trace_kind::span);
    trace_->record(r);
    give_back(p.start);
    give_back(p.stop);
  }
  pending_.clear();
  if (previous) give_back(previous->event); // every span that referred to it is recorded
}

} // namespace dsa::train
