// Collects trace records into per-thread buffers. record() takes an
// uncontended per-buffer lock (tens of ns) and appends 64 bytes; nothing is
// formatted or sent while the run is going. snapshot() gathers all buffers.
// One recorder per run; any thread may record.
#pragma once

#include "actors/trace/trace_record.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dsa::actors {

// A whole trace in memory: names, actor names, records sorted by t0.
struct trace_data {
  std::vector<std::string> names; // index = trace_record::name
  std::vector<std::string> actors; // index = actor id
  std::vector<trace_record> records;
};

class trace_recorder {
public:
  trace_recorder();
  ~trace_recorder();
  trace_recorder(const trace_recorder&) = delete;
  trace_recorder& operator=(const trace_recorder&) = delete;

  std::uint64_t now_ns() const;
  void set_actor_name(std::uint32_t actor, std::string name);
  void record(const trace_record& r);

  // Records of every thread so far, sorted by (t0, actor).
  trace_data snapshot() const;

private:
  struct buffer {
    std::mutex mutex;
    std::vector<trace_record> records;
  };
  buffer& local_buffer();

  const std::uint64_t id_;
  const std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mutex_; // guards buffers_ and actors_
  std::vector<std::unique_ptr<buffer>> buffers_;
  std::vector<std::string> actors_;
};

// A span that records itself on destruction (also when compute throws).
class trace_span {
public:
  trace_span(trace_recorder* rec, trace_name name, std::uint32_t actor, std::int32_t stage,
             std::uint32_t step, std::uint32_t micro_batch);
  ~trace_span();
  trace_span(const trace_span&) = delete;
  trace_span& operator=(const trace_span&) = delete;

private:
  trace_recorder* rec_;
  trace_record r_;
};

} // namespace dsa::actors
