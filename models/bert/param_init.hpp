// Deterministic parameter initialisation from a seed, as HF BertPreTrainedModel
// does it: N(0, initializer_range) for weights and embeddings (the pad row of
// the word embedding zeroed), zeros for biases, ones/zeros for LayerNorm.
// Each tensor draws from a Philox stream keyed by a hash of its name, so any
// rank initialises the layers it owns identically and independently.
#pragma once

#include "core/tensor.hpp"
#include "models/bert/bert_config.hpp"
#include "models/bert/parameter_specs.hpp"

#include <cstdint>
#include <string_view>

namespace dsa::bert {

// 32-bit FNV-1a of a parameter name: the stream id of its initialisation.
std::uint32_t name_hash(std::string_view name);

// value: f32 tensor of spec.shape, overwritten.
void init_parameter(const tensor& value, const param_spec& spec, const bert_config& cfg,
                    std::uint64_t seed);

// out: (n) = N(0, stddev) draws of the stream (seed, name): element i uses Box-Muller on
// Philox block i / 4, so the values do not depend on how the tensor is split.
void normal_fill(float* out, std::int64_t n, float stddev, std::uint64_t seed,
                 std::string_view name);

} // namespace dsa::bert
