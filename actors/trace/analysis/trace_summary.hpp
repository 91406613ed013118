// `dsactor trace RUN summary`: where the time of a run went, from its traces
// (one file per data-parallel rank): per actor busy and communication time,
// its time waiting for input, waiting for a credit and idle (trace_waits.hpp),
// spans, messages and bytes in and out; per step its time, compute vs
// communication vs I/O time and their overlaps, the measured pipeline bubble
// beside (S-1)/(M+S-1), and the gradient allreduce time with its overlap with
// backward. Ranks are not put on one clock yet: each rank's
// times count from its own recorder's origin.
#pragma once

#include "actors/trace/trace_recorder.hpp"
#include "core/error.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::actors {

struct rank_trace {
  std::uint32_t rank = 0;
  std::string path;
  trace_data trace;
};

// A trace file, or a run directory's trace.dsat and trace.rank<r>.dsat, by rank; with
// stages across processes one trace per replica, its processes' merged
// (join_pipeline_processes, trace_join.hpp); without `join_processes`, one per file.
expected<std::vector<rank_trace>> load_run_traces(const std::string& run_dir_or_file, bool join_processes = true);

struct actor_usage {
  std::string name, role; // role: the name's first word (stage, reducer, optimizer, feeder ...)
  std::uint32_t rank = 0;
  std::int32_t stage = -1; // -1: not a stage's actor
  double busy_s = 0; // time inside compute spans (every span but allreduce), overlaps counted once
  double comm_s = 0; // time inside allreduce spans
  // The rank's trace window outside any span of the actor, split (trace_waits.hpp):
  double input_wait_s = 0;  // waiting for the message that gave the next span its input
  double credit_wait_s = 0; // input there, waiting for the release of its output slot
  double idle_s = 0;        // the rest
  std::uint64_t spans = 0, messages_in = 0, messages_out = 0, bytes_in = 0, bytes_out = 0;
};

struct step_usage {
  std::uint32_t rank = 0, step = 0;
  double start_s = 0, time_s = 0; // first to last span of the step (forward .. optimizer); start on the common clock
  double bubble = 0; // stages' mean idle share of the step's forward-to-backward window
  double allreduce_s = 0, overlap_s = 0; // over all stages; overlap: during the stage's backward
  // The gradient bytes the step's allreduce spans summed, and the network's bus bandwidth
  // they achieved: bytes over the spans' summed time x 2(n-1)/n for n ranks (what each
  // rank sent and received in a ring allreduce, as nccl-tests' busbw); 0 without bytes.
  std::uint64_t allreduce_bytes = 0;
  double bus_gbps = 0;
  // Union over all actors of the step's spans by class (is_io_span, allreduce,
  // the rest compute) and the time two classes ran at once.
  double compute_s = 0, comm_s = 0, io_s = 0;
  double compute_comm_s = 0, compute_io_s = 0, comm_io_s = 0;
  std::string critical_path; // the largest shares of the step on its critical path (trace_critical_path.hpp)
};

struct rank_usage {
  std::uint32_t rank = 0;
  std::string path;
  std::uint32_t version = 0, stages = 0, micro_batches = 0;
  std::uint32_t ranks = 1; // data-parallel ranks of the run (info "ranks")
  double offset_s = 0;     // where the trace's origin lies on the common clock (trace_clock.hpp)
  std::uint64_t records = 0;
  double window_s = 0; // first to last record
  // Per stage (index = stage): the union of its device spans, the time its GPU was busy;
  // empty when the trace has none (CPU stages).
  std::vector<double> gpu_busy_s;
  trace_end end;
};

struct trace_summary {
  std::vector<rank_usage> ranks;
  std::vector<actor_usage> actors; // by role, rank, stage
  std::vector<step_usage> steps;   // by rank, step
  std::string clock;               // how the ranks' times are aligned (trace_clock.hpp)
  std::vector<double> offset_s;    // per rank in `ranks`: its origin on the common clock
};

// I/O spans: names that start with "swap", "nvme" or "io" (recorded: the NVMe
// swap's swap_read and swap_write, and swap_update, a shard's update of one chunk). They
// run beside the actors' work (swap_update inside the shard's optimizer span): not in an
// actor's busy time or waits, nor in a step's window or critical path; the step's I/O
// time counts the transfers alone.
bool is_io_span(const std::string& name);
// Device spans: names that start with "gpu" (a CUDA stage's gpu_forward and gpu_backward,
// its kernels' time from CUDA events). They run on the device beside the stage's worker:
// not in its busy time, waits, step window or critical path; summed per stage as the GPU's
// busy time (rank_usage::gpu_busy_s).
bool is_device_span(const std::string& name);
// Either kind: a span beside an actor's worker rather than its work.
bool is_beside_span(const std::string& name);

trace_summary summarize_traces(const std::vector<rank_trace>& traces);

struct summary_format {
  bool per_step = false; // every step's row (`dsactor trace RUN summary --steps`); else their distribution
  std::string before_verdict; // more sections (the swap I/O's), printed before the closing verdict
};
// What a terminal user reads first, on one screen: the traces, the per-actor table, per rank
// the step-time distribution (median, p90, max and the slowest steps), the bubble and
// overlap figures, and a closing line saying where the time went and what bounds the step.
std::string format_trace_summary(const trace_summary& summary, summary_format format = {});

} // namespace dsa::actors
