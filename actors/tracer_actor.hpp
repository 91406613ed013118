// The tracer of a process: owns where the trace goes. The trace_writer's
// thread streams the records to the file while the run goes; on (flush_atom)
// the tracer finishes the writer (the rest of the records, the end frame, a
// sync) and replies with an error text ("" on success). Actors never message
// it per event: they record into the recorder directly.
#pragma once

#include "actors/trace/trace_writer.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

namespace dsa::actors {

// writer null: flush does nothing (no file). `writer` must outlive the actor.
caf::actor spawn_tracer(caf::actor_system& sys, trace_writer* writer);

} // namespace dsa::actors
