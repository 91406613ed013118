// The optimizer shard of one stage: when the stage's accumulated gradients of
// step k arrive it runs optimizer_compute::update on its own worker thread,
// returns the gradient slot, and sends parameter version k + 1 to the stage.
// Its update overlaps the other stages' backward.
#pragma once

#include "actors/actor_setup.hpp"
#include "actors/compute.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

namespace dsa::actors {

// Spawns the shard of stage `index`. Then expects (wire_atom, stage, coordinator).
// `optimizer` must be initialised and outlive the actor.
caf::actor spawn_optimizer(caf::actor_system& sys, const actor_setup& setup, std::uint32_t index,
                           optimizer_compute* optimizer);

} // namespace dsa::actors
