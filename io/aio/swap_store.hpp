// ZeRO-Infinity's optimizer swap: a partition's fp32 master, exp_avg and exp_avg_sq
// in three swap files on NVMe, moved by a submitter (the aio engine, or the run's NVMe
// engine actor) one sub-group (chunk) at a time through a small set of aligned buffers
// (optim/chunked_state.hpp). Reads a sweep waits for go as io_priority::update, a
// prefetch's as prefetch, writes behind the update (pipeline_write) as write_behind.
//
// A sweep keeps up to three chunks in flight, as DeepSpeed's pipelined swapper
// does: with pipeline_read the next chunk is read while the current one is
// updated, with pipeline_write the last one is written meanwhile. Unlike
// DeepSpeed's, the buffers keep their contents between sweeps: after a step the
// optimizer asks for the first chunks of its next step (prefetch), which are then
// read while the stages run forward and backward, and the last writes finish then. Each chunk in
// flight takes one buffer per array (3), so the buffers needed are
// 3 x (1 + pipeline_read + pipeline_write); create() refuses fewer, naming the
// count, where DeepSpeed asserts mid-run ("ran out of swap buffers").
//
// The files are scratch: created under the given directory, never read by a
// checkpoint (which reads the state back through read_arrays), and removed when
// the store is destroyed. A file changed under the run (cut short, removed) fails
// the next read or write with an error naming it (a write never extends a cut file
// with zeros); a full disk fails the write naming it. DSA_SWAP_HOLD_FIFO is the fault
// tests' hook: the first sweep that reads waits on that FIFO (swap_store.cpp).
#pragma once

#include "core/error.hpp"
#include "io/aio/submitter.hpp"
#include "io/aio/aligned_buffer_pool.hpp"
#include "optim/chunked_state.hpp"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <string>
#include <vector>

namespace dsa::aio {

// One transfer of a chunk (the arrays of one buffer set, read or written together),
// reported to swap_options::observer when its last request has ended; or, with
// `compute`, a sweep's work on a chunk (the chunk function, op and bytes unused),
// reported when it returns. Times are std::chrono::steady_clock nanoseconds since that
// clock's epoch.
struct swap_transfer {
  aio_op op = aio_op::read;
  std::int64_t chunk = 0;
  std::uint64_t bytes = 0;            // over its arrays
  std::uint64_t t0_ns = 0, t1_ns = 0; // its first request submitted .. its last ended
  // The sweep it serves, numbered as sweeps() counts them: a sweep's own reads and
  // writes carry its number, a prefetch's reads the number of the sweep after the last.
  std::uint64_t sweep = 0;
  bool prefetch = false; // read by prefetch(), ahead of its sweep
  bool ok = true;        // false: a request failed (the sweep reports the error)
  bool compute = false;  // the chunk function's run, not a transfer
};
// Called where completions run (an aio engine thread, or the NVMe engine actor) while the
// store's lock is held: it must be short and must not call back into the store.
using swap_observer = std::function<void(const swap_transfer&)>;

// What a store moved and how its sweeps spent their time, for the end-of-run log.
struct swap_stats {
  std::uint64_t bytes_read = 0, bytes_written = 0;
  std::uint64_t chunk_reads = 0, chunk_writes = 0; // transfers that ended well
  std::uint64_t chunks_prefetched = 0; // chunks a sweep found already read by a prefetch
  std::uint64_t wait_ns = 0;    // inside sweeps, outside the chunk function: waiting for transfers
  std::uint64_t compute_ns = 0; // inside the chunk function (the update of the chunk)
  std::uint64_t gate_ns = 0;    // inside sweep_when, waiting for a chunk's inputs (not in wait_ns)
  std::uint64_t busy_ns = 0;    // time with at least one transfer in flight
};

struct swap_options {
  std::string dir;  // an existing, writable directory
  std::string name; // file stem: <dir>/<name>.{master,exp_avg,exp_avg_sq}.swp
  std::int64_t numel = 0; // elements of each array
  // Elements per chunk (DeepSpeed's sub_group_size), rounded up to `granule`; chunks
  // then start on multiples of the granule (the flat layout's alignment).
  std::int64_t sub_group = 1'000'000'000;
  std::int64_t granule = 2048;
  std::size_t buffer_count = 4; // zero_optimization.offload_optimizer.buffer_count: all used, in sets of 3
  bool pipeline_read = false;       // read chunk i + 1 while chunk i is updated
  bool pipeline_write = false;      // write chunk i - 1 while chunk i is updated
  // Sweeps and prefetches visit the chunks from the last to the first: the order in which
  // a backward pass finishes the gradients, for an update that follows it (streamed).
  bool descending = false;
  memory_pinning pinning = memory_pinning::pageable;
  swap_observer observer; // optional: each chunk transfer as it ends (tracing)
};

// Buffers a sweep needs with these pipelining settings: 3 per chunk in flight.
std::size_t swap_buffers_needed(bool pipeline_read, bool pipeline_write);
// Buffers a store allocates for buffer_count: whole sets of 3 (buffer_count rounded down).
std::size_t swap_buffers_allocated(std::size_t buffer_count);
// Elements per chunk for sub-groups of `sub_group` over `numel` elements in `granule`s.
std::int64_t swap_chunk_numel(std::int64_t sub_group, std::int64_t granule, std::int64_t numel);

class swap_store final : public optim::chunked_state {
public:
  // `engine` (an aio_engine or an NVMe engine actor's port) is kept until the store goes.
  // Creates the buffers; the files appear with the first sweep that writes.
  static expected<std::unique_ptr<swap_store>> create(std::shared_ptr<submitter> engine, const swap_options& options);
  ~swap_store() override; // removes the files
  swap_store(const swap_store&) = delete;
  swap_store& operator=(const swap_store&) = delete;

  std::int64_t numel() const override { return options_.numel; }
  std::int64_t chunk_numel() const override { return chunk_; }
  // Chunks this sweep needs that a prefetch already holds are not read again; with
  // pipeline_write the last writes may still be in flight when it returns (a later sweep
  // or prefetch waits for a chunk's write before reading it again; an error of such a
  // transfer is returned by the next sweep or flush).
  status sweep(unsigned read, unsigned write, const optim::chunk_fn& fn) override {
    return sweep_when(read, write, {}, fn);
  }
  // While a chunk's inputs are not final, the free buffer sets read the next chunks.
  status sweep_when(unsigned read, unsigned write, const optim::chunk_ready& ready, const optim::chunk_fn& fn) override;
  void wake() override;
  // Starts reading the `read` arrays of the first chunks into the free buffer sets, for
  // the next sweep (the optimizer's next step) to find them there: the read overlaps the
  // forward and backward passes in between. Never blocks.
  void prefetch(unsigned read) override;
  // Waits for every transfer in flight; their first error, if any.
  status flush() override;
  // A speculative update (pipeline.speculative_update): from begin_shadow on, sweeps write
  // to a second set of files (<name>.<array>.next.swp) and read the state's own files,
  // which stay as they were (an updating sweep may not read an array written since
  // begin_shadow: an error), and a prefetch waits. commit_shadow
  // makes the arrays written since the state (the files trade places), then starts the
  // waiting prefetch; discard_shadow forgets them, as if no sweep had run since
  // begin_shadow. No I/O is added: the writes go elsewhere, at the cost of the disk space.
  status begin_shadow();
  status commit_shadow();
  status discard_shadow();
  // Waits for every transfer in flight, leaving an error to the next sweep or flush
  // (the observer has then seen every transfer started so far).
  void wait_idle();
  // Sweeps begun so far (swap_transfer::sweep numbers them from 1).
  std::uint64_t sweeps() const { return sweeps_.load(); }
  swap_stats stats() const;
  std::int64_t resident_bytes() const override;
  std::string where() const override { return "nvme: " + options_.dir; }

  const std::string& path(optim::state_array a) const { return paths_[a]; }
  // Elements [lo, lo + count) of array a as the state holds them (outside a sweep: a
  // checkpoint streaming the masters tensor by tensor), read through one aligned buffer of
  // about count elements; waits for the read.
  status read_range(optim::state_array a, std::int64_t lo, std::int64_t count, float* out);
  // Bytes moved so far, for the logs and the bench.
  std::uint64_t bytes_read() const { return bytes_read_.load(); }
  std::uint64_t bytes_written() const { return bytes_written_.load(); }
  std::size_t buffers() const { return buffers_.size(); }

private:
  swap_store(std::shared_ptr<submitter> engine, const swap_options& options, std::int64_t chunk);
  struct flight;
  std::pair<std::int64_t, std::int64_t> range(std::int64_t chunk) const;
  // The chunk a sweep visits at `position` (0 first): the same, or counted from the end.
  std::int64_t chunk_at(std::int64_t position) const {
    return options_.descending ? chunks() - 1 - position : position;
  }
  struct report; // one transfer() call, until its last request ends
  enum class reading_for { this_sweep, next_sweep }; // next_sweep: a prefetch
  // Continues a prefetch as buffer sets free up (under the lock, from prefetch() or a completion).
  void pump(std::unique_lock<std::mutex>& lock);
  void transfer(std::unique_lock<std::mutex>& lock, std::size_t slot, aio_op op, unsigned mask,
                reading_for serves = reading_for::this_sweep);
  void ended(report& r); // under flight_->mu
  error settle(std::unique_lock<std::mutex>& lock);

  std::shared_ptr<submitter> engine_;
  swap_options options_;
  std::int64_t chunk_ = 0;
  std::string paths_[optim::state_arrays];
  // The second set of files for speculative sweeps (begin_shadow): their paths, which of
  // them exist at full length, whether one is open and which arrays it wrote, and the
  // prefetch asked for meanwhile. Set on the optimizer's thread under flight_->mu.
  std::string shadow_paths_[optim::state_arrays];
  unsigned shadow_full_ = 0, shadow_round_ = 0, deferred_prefetch_ = 0;
  bool shadow_open_ = false;
  // The file a transfer of array a uses (under flight_->mu).
  const std::string& file_of(unsigned a, aio_op op) const;
  // Arrays a whole sweep has written (their files exist at full length), and the sweeps so
  // far: set on the optimizer's thread, read by a prefetch a completion continues.
  std::atomic<unsigned> written_{0};
  std::unique_ptr<aligned_buffer_pool> pool_;
  std::vector<pool_buffer> buffers_; // after pool_: returned before it goes
  std::atomic<std::uint64_t> bytes_read_{0}, bytes_written_{0};
  std::atomic<std::uint64_t> sweeps_{0};
  std::unique_ptr<flight> flight_;                   // last: goes first, after flush()
};

} // namespace dsa::aio
