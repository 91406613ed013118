// Streams a recorder's trace to a version-2 file while the run goes: opened
// at the start (header, names, actors, info), then a background thread drains
// the recorder's per-thread buffers every `interval`, or sooner when a buffer
// reaches `full_records`, and appends records frames with one write(2) each.
// The buffers thus stay bounded, and a process killed with kill -9 leaves every
// frame written before it died (they are in the page cache). finish() drains
// the rest, appends the end frame and syncs the file.
#pragma once

#include "actors/trace/trace_recorder.hpp"
#include "core/error.hpp"
#include "io/ckpt/posix_file.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dsa::actors {

struct trace_writer_options {
  std::chrono::milliseconds interval{1000}; // longest time between two drains
  std::size_t full_records = 16384; // a thread's buffer this full (1 MiB) wakes the writer early
};

class trace_writer {
public:
  // Creates (truncates) `path` and writes the header frames; starts the thread.
  // The recorder must outlive the writer; set its actor names first.
  static expected<std::unique_ptr<trace_writer>>
  open(trace_recorder& recorder, std::string path,
       std::vector<std::pair<std::string, std::string>> info, trace_writer_options options = {});
  ~trace_writer(); // finish(), its error dropped
  trace_writer(const trace_writer&) = delete;
  trace_writer& operator=(const trace_writer&) = delete;

  // Stops the thread, writes what is left and the end frame, syncs and closes.
  // Idempotent: later calls return the first call's result. Records made after
  // it stay in the recorder.
  status finish();

  const std::string& path() const { return path_; }
  // Appends a flight frame (io/net/flight_recorder.hpp's encoding of a snapshot). Any
  // thread; after finish() an error. The writer's thread also writes one by itself when
  // net::request_flight_dump() was called (SIGUSR1, a stop signal), within `interval`.
  status append_flight(const std::string& payload);
  // Records and records frames written so far (any thread may ask).
  std::uint64_t records_written() const { return records_written_.load(std::memory_order_relaxed); }
  std::uint64_t frames_written() const { return frames_written_.load(std::memory_order_relaxed); }

private:
  // Shared with the recorder's full hook, which may fire after the writer is gone.
  struct wake_state {
    std::mutex mutex;
    std::condition_variable cv;
    bool wake = false, stop = false;
  };

  trace_writer(trace_recorder& recorder, std::string path, ckpt::unique_fd fd,
               trace_writer_options options);
  void loop();
  status flush_once(); // drain and append one batch (writer thread, or finish() after the join)
  status append(const std::string& bytes); // under append_mutex_
  std::mutex append_mutex_; // the writer's thread and append_flight's callers write whole frames

  trace_recorder& recorder_;
  const std::string path_;
  ckpt::unique_fd fd_;
  const trace_writer_options options_;
  std::shared_ptr<wake_state> wake_;
  std::vector<trace_record> batch_; // reused between drains
  std::vector<std::string> actors_; // the actor table last written
  std::atomic<std::uint64_t> records_written_{0}, frames_written_{0};
  status status_; // ok, or the first write error (the writer thread's until joined)
  bool finished_ = false;
  std::thread thread_; // started by open() once the header frames are written
};

} // namespace dsa::actors
