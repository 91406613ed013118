// Per-thread trace buffers; see trace_recorder.hpp.
#include "actors/trace/trace_recorder.hpp"

#include <algorithm>
#include <atomic>

namespace dsa::actors {

namespace {
std::atomic<std::uint64_t> next_recorder_id{1};

// The calling thread's buffer for the recorder it used last. Recorder ids are
// never reused, so a stale entry can only miss, never alias.
struct thread_cache {
  std::uint64_t recorder = 0;
  void* buffer = nullptr;
};
thread_local thread_cache cache;
} // namespace

const char* trace_name_string(trace_name name) {
  static const char* const names[] = {"forward",  "backward", "optimizer",   "load",
                                      "produced", "released", "step_report", "update_report",
                                      "reduce",   "grad_partial", "allreduce"};
  auto i = static_cast<std::size_t>(name);
  return i < static_cast<std::size_t>(trace_name::count_) ? names[i] : "?";
}

trace_recorder::trace_recorder() : id_(next_recorder_id++), origin_(std::chrono::steady_clock::now()) {}
trace_recorder::~trace_recorder() = default;

std::uint64_t trace_recorder::now_ns() const {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - origin_).count());
}

void trace_recorder::set_actor_name(std::uint32_t actor, std::string name) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (actors_.size() <= actor) actors_.resize(actor + 1);
  actors_[actor] = std::move(name);
}

trace_recorder::buffer& trace_recorder::local_buffer() {
  if (cache.recorder != id_) {
    std::lock_guard<std::mutex> lock(mutex_);
    buffers_.push_back(std::make_unique<buffer>());
    buffers_.back()->records.reserve(4096);
    cache = {id_, buffers_.back().get()};
  }
  return *static_cast<buffer*>(cache.buffer);
}

void trace_recorder::record(const trace_record& r) {
  buffer& b = local_buffer();
  std::lock_guard<std::mutex> lock(b.mutex);
  b.records.push_back(r);
}

trace_data trace_recorder::snapshot() const {
  trace_data out;
  for (std::uint16_t i = 0; i < static_cast<std::uint16_t>(trace_name::count_); ++i)
    out.names.emplace_back(trace_name_string(static_cast<trace_name>(i)));
  std::lock_guard<std::mutex> lock(mutex_);
  out.actors = actors_;
  for (const auto& b : buffers_) {
    std::lock_guard<std::mutex> buffer_lock(b->mutex);
    out.records.insert(out.records.end(), b->records.begin(), b->records.end());
  }
  std::stable_sort(out.records.begin(), out.records.end(), [](const trace_record& a, const trace_record& b) {
    return a.t0_ns != b.t0_ns ? a.t0_ns < b.t0_ns : a.actor < b.actor;
  });
  return out;
}

trace_span::trace_span(trace_recorder* rec, trace_name name, std::uint32_t actor, std::int32_t stage,
                       std::uint32_t step, std::uint32_t micro_batch)
    : rec_(rec) {
  if (!rec_) return;
  r_.kind = static_cast<std::uint8_t>(trace_kind::span);
  r_.name = static_cast<std::uint16_t>(name);
  r_.actor = actor;
  r_.stage = stage;
  r_.step = step;
  r_.micro_batch = micro_batch;
  r_.t0_ns = rec_->now_ns();
}

trace_span::~trace_span() {
  if (!rec_) return;
  r_.t1_ns = rec_->now_ns();
  rec_->record(r_);
}

} // namespace dsa::actors
