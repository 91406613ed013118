// The stage actor: a thin CAF shell around stage_scheduler. Arrivals and
// credits go to the scheduler; what pick() returns runs on the stage's own
// compute_worker thread and comes back as work_done. One per pipeline stage.
#pragma once

#include "actors/actor_setup.hpp"
#include "actors/compute.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

namespace dsa::actors {

// Spawns stage `index`. Then expects (wire_atom, upstream, downstream, feeder,
// shard, reducer, coordinator): upstream is the feeder on stage 0, downstream is
// invalid on the last stage. `compute` must outlive the actor.
caf::actor spawn_stage(caf::actor_system& sys, const actor_setup& setup, std::uint32_t index,
                       stage_compute* compute);

} // namespace dsa::actors
