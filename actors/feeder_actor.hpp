// The feeder: produces micro-batches in (step, micro_batch) order on credit.
// Each needs a free input slot (to the first stage) and a free labels slot (to
// the last stage); batch_source::fill runs on the feeder's worker thread.
#pragma once

#include "actors/actor_setup.hpp"
#include "actors/compute.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

namespace dsa::actors {

// Spawns the feeder. Then expects (wire_atom, first stage, last stage) and go_atom.
caf::actor spawn_feeder(caf::actor_system& sys, const actor_setup& setup, batch_source* source);

} // namespace dsa::actors
