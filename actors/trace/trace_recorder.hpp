// Collects trace records into per-thread buffers. record() takes an
// uncontended per-buffer lock (tens of ns) and appends 64 bytes; nothing is
// formatted or sent while the run is going. snapshot() gathers all buffers;
// drain() moves them out (the trace_writer thread does so periodically, which
// bounds the buffers). One recorder per run; any thread may record.
#pragma once

#include "actors/trace/trace_record.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dsa::actors {

// Where a trace read from a file ends (see trace_file.hpp).
struct trace_end {
  bool closed = true;            // the writer finished the file (version 1: always)
  std::uint64_t valid_bytes = 0; // bytes up to the end of the last complete frame
  std::uint64_t file_bytes = 0;
  std::string why;               // when !closed: what stopped the reader at valid_bytes
};

// A whole trace in memory: names, actor names, records sorted by t0.
struct trace_data {
  std::vector<std::string> names; // index = trace_record::name
  std::vector<std::string> actors; // index = actor id
  std::vector<trace_record> records;
  // Read from a file only: its format version, its key/value facts (rank,
  // stages, micro_batches, origin_unix_ns ...) and where it ends.
  std::uint32_t version = 0;
  std::vector<std::pair<std::string, std::string>> info;
  trace_end end;
  // The flight records written into the file (io/net/flight_recorder.hpp's encoding), in
  // file order: each a snapshot of the process's recent collectives and pipeline edges.
  std::vector<std::string> flights;
  // The value of info key `key`, or "" when absent.
  std::string info_value(const std::string& key) const;
};

// Sorts records by (t0, actor), keeping the order of equal ones: a trace's order.
void sort_trace_records(std::vector<trace_record>& records);

// The names of trace_name in index order (the names table of a trace).
std::vector<std::string> trace_name_table();

// A fact the recorder's owner writes into the trace's info frame so that traces of several
// processes align (analysis/trace_clock.hpp): this boot's id
// (/proc/sys/kernel/random/boot_id; empty when missing).
std::string current_boot_id();

class trace_recorder {
public:
  trace_recorder();
  ~trace_recorder();
  trace_recorder(const trace_recorder&) = delete;
  trace_recorder& operator=(const trace_recorder&) = delete;

  std::uint64_t now_ns() const;
  // A std::chrono::steady_clock time (ns since that clock's epoch) on the now_ns() clock;
  // 0 for a time before the origin.
  std::uint64_t since_origin_ns(std::uint64_t steady_ns) const;
  // The system clock at the origin of now_ns(), in ns since the Unix epoch
  // (for placing several processes' traces on one clock).
  std::uint64_t origin_unix_ns() const { return origin_unix_ns_; }
  // The steady clock at that origin, in ns since its epoch (CLOCK_MONOTONIC: the same
  // clock in every process of one boot of a host).
  std::uint64_t origin_steady_ns() const;
  void set_actor_name(std::uint32_t actor, std::string name);
  std::vector<std::string> actor_names() const;
  void record(const trace_record& r);

  // Records of every thread so far, sorted by (t0, actor).
  trace_data snapshot() const;
  // Appends the records of every thread to `out` (unsorted) and empties the
  // buffers, keeping their capacity; returns how many were moved.
  std::size_t drain(std::vector<trace_record>& out);
  // `on_full` is called (on the recording thread, outside any recorder lock) each
  // time a thread's buffer reaches `records` records, so a writer can drain early.
  // Set it before any thread records.
  void set_full_hook(std::size_t records, std::function<void()> on_full);

private:
  struct buffer {
    std::mutex mutex;
    std::vector<trace_record> records;
    std::vector<trace_record> spare; // drain() only (under mutex_): swapped with records
  };
  buffer& local_buffer();

  const std::uint64_t id_;
  const std::chrono::steady_clock::time_point origin_;
  const std::uint64_t origin_unix_ns_;
  std::size_t full_records_ = 0; // 0: no hook
  std::function<void()> on_full_;
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
  // Records nothing: the work it timed turned out not to happen (a shard that did not speculate).
  void cancel() { rec_ = nullptr; }
  // The bytes the span moved or worked on (an allreduce: the bucket's gradient bytes).
  void set_bytes(std::uint64_t bytes) { r_.bytes = bytes; }

private:
  trace_recorder* rec_;
  trace_record r_;
};

} // namespace dsa::actors
