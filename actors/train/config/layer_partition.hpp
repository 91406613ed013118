// Splitting BERT into pipeline stages (DeepSpeed's partition_method): the
// embeddings go to the first stage and the head to the last; encoder layers are
// divided contiguously by
//   uniform         equal numbers of layers,
//   parameters      balanced parameter counts (embeddings and head included),
//   type:<regex>    equal numbers of the layers whose name matches (the others
//                   follow along); layer names are "embeddings", "BertLayer"
//                   and "head", so "type:BertLayer" (or "type:transformer|Bert")
//                   is uniform over encoder layers,
//   layers:<n0>,<n1>,...  stage s gets n_s encoder layers (dsactor's: a split chosen by
//                   measured time, as `dsactor bench pipeline` does).
#pragma once

#include "core/error.hpp"
#include "models/bert/bert_config.hpp"
#include "models/bert/bert_range.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::train {

expected<std::vector<bert::bert_range>> partition_layers(const bert::bert_config& cfg, std::uint32_t stages,
                                                         const std::string& method);

// "embeddings + layers [0, 2) | layers [2, 4) + head": the stages' ranges in order.
std::string describe_layout(const std::vector<bert::bert_range>& ranges);
// describe_layout's text back into ranges, each valid for `cfg` (a checkpoint's saved layout).
expected<std::vector<bert::bert_range>> parse_layout(const std::string& text, const bert::bert_config& cfg);

// Contiguous split of `weights` into `parts` non-empty runs minimising the largest
// run sum; returns the start index of each part (first is 0).
std::vector<std::size_t> balanced_split(const std::vector<double>& weights, std::size_t parts);

} // namespace dsa::train
