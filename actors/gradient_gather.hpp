// Gradients into the optimizer shard's f32 buffers: the reducer's gather and its
// streamed parts (reducer_actor.cpp) share these.
#pragma once

#include "actors/compute.hpp"
#include "actors/slot_table.hpp"

#include <cstddef>
#include <vector>

namespace dsa::actors {

// Gradient i (already summed over the data-parallel ranks, if several) into the shard's
// f32 buffer i: whole, or only the part the shard keeps (`kept`, ZeRO stage 2; with
// `presummed` the gradient holds that part alone). A gradient that does not fit throws,
// naming it.
void cast_gradient(std::size_t i, const tensor& g, tensor& b, const std::vector<gradient_part>& kept, bool presummed);

// Every gradient into the shard's buffers (cast_gradient). Returns the sum of squares of
// all but `skip`, over the whole gradients either way (the cast to f32 is exact, so it
// equals the sum over whole f32 buffers).
double gather(const slot_contents& grads, slot_contents& buffers, const std::vector<gradient_part>& kept, int skip,
              bool presummed);

} // namespace dsa::actors
