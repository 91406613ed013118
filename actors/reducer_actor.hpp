// The gradient reducer of one stage: between the stage and its optimizer shard,
// it turns the stage's accumulated gradients of a step into what the update
// needs, by message: the tied parameter's gradient summed between the first and
// the last stage, and (with grad_scope::global) the sum of squares over all
// stages for clipping and the fp16 overflow check. reducer_state.hpp describes
// the steps; the compute (casting into the shard's f32 buffers, sums) runs on
// the reducer's own worker thread. With several data-parallel ranks the gather
// job also sums the stage's gradients over the ranks (data_parallel.hpp) before
// taking the sum of squares.
#pragma once

#include "actors/actor_setup.hpp"
#include "actors/compute.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

namespace dsa::actors {

// Spawns the reducer of stage `index`. The reduced edge's slot must already
// hold the shard's gradient_buffers(). tied_index: the position of the tied
// parameter in the stage's parameters (used when the plan exchanges it), or -1.
// kept: the shard's gradient_parts() (empty: it keeps every gradient whole; else
// the tied parameter's part must be whole). presummed: the stage sums its gradients
// over the ranks itself and publishes only the kept parts (stage_compute::gradients_reduced):
// no bucket sums, and the sum of squares is this rank's parts' summed over the ranks.
// shard: the stage's optimizer compute (borrowed, outliving the run; may be null), whose
// sums_gradients() each bucket sum asks first: false leaves the bucket unsummed (each rank
// keeps its own gradients for a compressed optimizer).
// Then expects (wire_atom, stage, shard)
// and (wire_atom, s, reducer of stage s) for every stage s.
caf::actor spawn_reducer(caf::actor_system& sys, const actor_setup& setup, std::uint32_t index, int tied_index,
                         std::vector<gradient_part> kept = {}, bool presummed = false,
                         const optimizer_compute* shard = nullptr);

} // namespace dsa::actors
