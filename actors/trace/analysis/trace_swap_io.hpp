// The I/O section of `dsactor trace RUN summary`: per rank and step, the optimizer
// shards' NVMe swap transfers (swap_read/swap_write spans): bytes moved, the bandwidth
// achieved over the time a transfer was in flight, and where that time fell: during a
// stage's forward or backward (hidden behind compute) or inside an optimizer span (an
// update waiting for, or writing behind, its chunks), and how much of the reading ran
// during the updates of chunks.
#pragma once

#include "actors/trace/analysis/trace_summary.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::actors {

struct swap_io_step {
  std::uint32_t rank = 0, step = 0;
  std::uint64_t bytes_read = 0, bytes_written = 0;
  std::uint64_t reads = 0, writes = 0; // chunk transfers
  double busy_s = 0;                   // union of the step's transfers
  double during_compute_s = 0;         // of busy_s: inside some stage's forward or backward span
  double inside_optimizer_s = 0;       // of busy_s: inside some optimizer span
  // Reads in flight while the shard updated another chunk (swap_update spans): the read of
  // chunk i+1 hidden behind the update of chunk i. Both 0 in a trace without swap_update.
  double read_s = 0, reads_during_update_s = 0;
  bool updated =
      false; // the trace holds an optimizer span of the step (not: a prefetch past the run's end)
  double gb_per_s() const {
    return busy_s > 0 ? static_cast<double>(bytes_read + bytes_written) / busy_s * 1e-9 : 0;
  }
};

// By rank, then step; empty for a run without NVMe offload.
std::vector<swap_io_step> summarize_swap_io(const std::vector<rank_trace>& traces);
// One line per step; "" when there is nothing to show.
std::string format_swap_io(const std::vector<swap_io_step>& steps);

} // namespace dsa::actors
