// The tracer of a process: owns where the trace goes. On (flush_atom) it
// snapshots the recorder's per-thread buffers and writes the binary trace file;
// it replies with an error text ("" on success). Actors never message it per
// event: they record into the recorder directly.
#pragma once

#include "actors/trace/trace_recorder.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <string>

namespace dsa::actors {

// path empty: flush only snapshots (nothing written). `trace` must outlive the actor.
caf::actor spawn_tracer(caf::actor_system& sys, trace_recorder* trace, std::string path);

} // namespace dsa::actors
