// The actors of a run (run.hpp's run_options::on_spawned), for code that talks to them
// directly: tests inject a message that breaks the protocol and check that the receiver
// fails by name. Apart from run.hpp, so a file that only starts runs does not compile CAF.
#pragma once

#include <caf/actor.hpp>

#include <vector>

namespace dsa::actors {

struct run_actors {
  caf::actor coordinator, feeder;
  std::vector<caf::actor> stages, shards, reducers; // [s]
};

} // namespace dsa::actors
