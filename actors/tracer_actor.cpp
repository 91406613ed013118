// The tracer actor; see tracer_actor.hpp.
#include "actors/tracer_actor.hpp"

#include "actors/protocol/protocol.hpp"
#include "actors/trace/trace_file.hpp"

#include <caf/all.hpp>

namespace dsa::actors {

namespace {

caf::behavior tracer_behavior(caf::event_based_actor*, trace_recorder* trace, std::string path) {
  return {
      [=](flush_atom) -> std::string {
        if (path.empty() || !trace) return "";
        // Writing a small file: a brief block of this scheduler thread, once per run.
        auto written = write_trace(path, trace->snapshot());
        return written ? std::string() : written.err().to_string();
      },
  };
}

} // namespace

caf::actor spawn_tracer(caf::actor_system& sys, trace_recorder* trace, std::string path) {
  return sys.spawn(tracer_behavior, trace, std::move(path));
}

} // namespace dsa::actors
