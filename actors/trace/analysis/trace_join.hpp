// Stages across processes: each process writes the trace of its own stages. Merged on the
// processes' common clock (trace_clock.hpp), the traces of one replica's processes are one
// trace of the whole pipeline, as a process running every stage would write: the same plan,
// actor ids and edges, each activation's send in one process and its receive in the other
// linked by their flow. Every view reads the merged traces, so the summary, the check and
// the critical path follow a step across processes.
#pragma once

#include "actors/trace/analysis/trace_summary.hpp"

#include <vector>

namespace dsa::actors {

// Traces whose info names a placement (run.cpp writes "placement" and "replica" for a run of
// stages across processes) merged per replica, in replica order, each as rank = its
// replica, path = its files joined by " + ", info its earliest trace's plus "processes" (the
// ranks merged); the others returned unchanged after them.
std::vector<rank_trace> join_pipeline_processes(std::vector<rank_trace> traces);

} // namespace dsa::actors
