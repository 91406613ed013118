// Per-thread trace buffers; see trace_recorder.hpp.
#include "actors/trace/trace_recorder.hpp"

#include <algorithm>
#include <atomic>
#include <fstream>

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
                                      "reduce",   "grad_partial", "allreduce", "swap_read", "swap_write",
                                      "speculate", "stream_update", "swap_update",
                                      "gpu_forward", "gpu_backward", "weight"};
  auto i = static_cast<std::size_t>(name);
  return i < static_cast<std::size_t>(trace_name::count_) ? names[i] : "?";
}

trace_recorder::trace_recorder()
    : id_(next_recorder_id++), origin_(std::chrono::steady_clock::now()),
      origin_unix_ns_(static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                     std::chrono::system_clock::now().time_since_epoch())
                                                     .count())) {}
trace_recorder::~trace_recorder() = default;

std::uint64_t trace_recorder::now_ns() const {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - origin_).count());
}

std::uint64_t trace_recorder::origin_steady_ns() const {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(origin_.time_since_epoch()).count());
}

std::uint64_t trace_recorder::since_origin_ns(std::uint64_t steady_ns) const {
  const auto origin = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(origin_.time_since_epoch()).count());
  return steady_ns > origin ? steady_ns - origin : 0;
}

void trace_recorder::set_actor_name(std::uint32_t actor, std::string name) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (actors_.size() <= actor) actors_.resize(actor + 1);
  actors_[actor] = std::move(name);
}

std::vector<std::string> trace_recorder::actor_names() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return actors_;
}

void trace_recorder::set_full_hook(std::size_t records, std::function<void()> on_full) {
  full_records_ = records;
  on_full_ = std::move(on_full);
}

std::string trace_data::info_value(const std::string& key) const {
  for (const auto& [k, v] : info)
    if (k == key) return v;
  return {};
}

trace_recorder::buffer& trace_recorder::local_buffer() {
  if (cache.recorder != id_) {
    std::lock_guard<std::mutex> lock(mutex_);
    buffers_.push_back(std::make_unique<buffer>());
    buffers_.back()->records.reserve(4096);
    buffers_.back()->spare.reserve(4096);
    cache = {id_, buffers_.back().get()};
  }
  return *static_cast<buffer*>(cache.buffer);
}

void trace_recorder::record(const trace_record& r) {
  buffer& b = local_buffer();
  std::size_t size;
  {
    std::lock_guard<std::mutex> lock(b.mutex);
    b.records.push_back(r);
    size = b.records.size();
  }
  // Once per filling of a buffer, not per record: the hot path stays one lock and a copy.
  if (size == full_records_ && on_full_) on_full_();
}

std::size_t trace_recorder::drain(std::vector<trace_record>& out) {
  const std::size_t before = out.size();
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& b : buffers_) {
    {
      // The recording thread waits only for this swap, not for the copy below;
      // the spare is empty with capacity, so its next records allocate nothing.
      std::lock_guard<std::mutex> buffer_lock(b->mutex);
      b->records.swap(b->spare);
    }
    out.insert(out.end(), b->spare.begin(), b->spare.end());
    b->spare.clear();
  }
  return out.size() - before;
}

void sort_trace_records(std::vector<trace_record>& records) {
  std::stable_sort(records.begin(), records.end(), [](const trace_record& a, const trace_record& b) {
    return a.t0_ns != b.t0_ns ? a.t0_ns < b.t0_ns : a.actor < b.actor;
  });
}

std::vector<std::string> trace_name_table() {
  std::vector<std::string> names;
  for (std::uint16_t i = 0; i < static_cast<std::uint16_t>(trace_name::count_); ++i)
    names.emplace_back(trace_name_string(static_cast<trace_name>(i)));
  return names;
}

trace_data trace_recorder::snapshot() const {
  trace_data out;
  out.names = trace_name_table();
  std::lock_guard<std::mutex> lock(mutex_);
  out.actors = actors_;
  for (const auto& b : buffers_) {
    std::lock_guard<std::mutex> buffer_lock(b->mutex);
    out.records.insert(out.records.end(), b->records.begin(), b->records.end());
  }
  sort_trace_records(out.records);
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

std::string current_boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

} // namespace dsa::actors
