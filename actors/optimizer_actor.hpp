// The optimizer shard of one stage: when its reducer hands it the reduced
// gradients of step k (in the shard's own gradient buffers, with the step's
// totals) it runs optimizer_compute::update on its own worker thread, gives
// the buffers back to the reducer, and sends parameter version k + 1 to the
// stage. Its update overlaps the other stages' backward. With update_release::when_allowed
// it starts the update of step k only once the coordinator allowed it
// ((allow_atom, j) allows steps <= j; the run's first step is always allowed),
// so that a run the coordinator stops after step k - 1 never updates past it
// and the step hooks of k - 1 see the shard's state of step k - 1. It also
// waits until the stage has read the previous version.
#pragma once

#include "actors/actor_setup.hpp"
#include "actors/compute.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

namespace dsa::actors {

enum class update_release {
  immediately,  // as soon as the gradients of the step arrive
  when_allowed, // and the coordinator allowed the step (runs with step hooks)
};

// Spawns the shard of stage `index`. Then expects (wire_atom, stage, reducer, coordinator).
// `optimizer` must be initialised and outlive the actor.
caf::actor spawn_optimizer(caf::actor_system& sys, const actor_setup& setup, std::uint32_t index,
                           optimizer_compute* optimizer, update_release release);

} // namespace dsa::actors
