// The tracer actor; see tracer_actor.hpp.
#include "actors/tracer_actor.hpp"

#include "actors/protocol/protocol.hpp"

#include <caf/all.hpp>

namespace dsa::actors {

namespace {

caf::behavior tracer_behavior(caf::event_based_actor*, trace_writer* writer) {
  return {
      [=](flush_atom) -> std::string {
        if (!writer)
          return "";
        // The last batch, a small frame and an fsync: a brief block of this scheduler thread, once
        // per run.
        auto finished = writer->finish();
        return finished ? std::string() : finished.err().to_string();
      },
  };
}

} // namespace

caf::actor spawn_tracer(caf::actor_system& sys, trace_writer* writer) {
  return sys.spawn(tracer_behavior, writer);
}

} // namespace dsa::actors
