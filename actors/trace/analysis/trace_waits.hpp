// Why each span of an actor started when it did. For every span the gap since
// the actor's previous span (the end of the latest earlier span; for its first
// span, the start of the trace) is split in three, from the actor's own records:
//   waiting for input:  until the `produced` receipt that gave the span its
//                       input arrived: the latest one the actor received
//                       before the span with the span's step and, for forward
//                       and backward spans, its micro-batch (reduce, optimizer,
//                       load and allreduce spans gather messages numbered
//                       otherwise);
//   waiting for credit: from then until the `released` receipt that freed the
//                       slot its output went to (the slots of the `produced`
//                       messages the actor sent after the span started and
//                       before its next span: the latest release of each such
//                       (edge, slot) before the span started);
//   idle:               the rest (dispatch, or work the trace does not show).
// The time after an actor's last span, to the end of the trace, is idle too.
// The latest of the three events (previous span's end, input, credit) is the
// one that bound the span's start: the critical path follows it.
#pragma once

#include "actors/trace/trace_recorder.hpp"

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace dsa::actors {

enum class span_bound { first, previous, input, credit };
const char* span_bound_string(span_bound b);

struct span_wait {
  std::size_t span = 0;         // index into trace_data::records
  std::int64_t previous = -1;   // the actor's earlier span that ended last (-1: none)
  std::int64_t input = -1;      // its `produced` receipt (-1: none found)
  std::int64_t credit = -1;     // the `released` receipt that freed its output slot (-1: none)
  std::uint64_t ready_ns = 0;   // end of `previous`, or the trace's start
  std::uint64_t input_wait_ns = 0, credit_wait_ns = 0, idle_ns = 0; // sum: start - ready (0 if overlapping)
  span_bound bound = span_bound::first;
  std::uint64_t bound_ns = 0;   // time of the binding event
};

struct actor_timeline {
  std::uint32_t actor = 0;
  std::vector<span_wait> spans; // by start time
  std::uint64_t tail_idle_ns = 0; // after the last span (the whole trace when no span)
  std::uint64_t input_wait_ns = 0, credit_wait_ns = 0, idle_ns = 0; // totals
};

// One timeline per actor id that has any record (indexed by actor id; ids
// without records have an empty timeline).
std::vector<actor_timeline> actor_timelines(const trace_data& trace);

// What the analyses look up per record, built once per trace (linear in its size).
struct trace_index {
  explicit trace_index(const trace_data& trace);
  std::vector<actor_timeline> timelines;
  std::vector<const span_wait*> wait_of; // by record index; nullptr for messages
  // The `send` record matching receipt `recv` (same flow, name and actors), or -1.
  std::int64_t matching_send(const trace_data& trace, std::size_t recv) const;

private:
  std::unordered_map<std::uint64_t, std::vector<std::size_t>> sends_; // by flow
};

// The actor's display name: its name in the trace, else "actor <id>".
std::string trace_actor_name(const trace_data& trace, std::uint32_t actor);

} // namespace dsa::actors
