// Which part of BERT a pipeline stage owns: encoder layers [first_layer,
// last_layer) plus, optionally, the embeddings (first stage) and the head (last
// stage). The word embedding is tied: every range that includes the embeddings
// or a pretraining head holds its own copy (see parameter_specs.hpp).
#pragma once

#include "models/bert/bert_config.hpp"

#include <cstdint>
#include <string>

namespace dsa::bert {

enum class embeddings_part { excluded, included };
enum class head_part { excluded, included };

struct bert_range {
  std::int64_t first_layer = 0;
  std::int64_t last_layer = 0; // exclusive
  embeddings_part embeddings = embeddings_part::excluded;
  head_part head = head_part::excluded;

  // All layers, embeddings and head: the whole model on one rank.
  static bert_range whole(const bert_config& cfg);
  // Layers [first, last) only; combine with the setters below.
  static bert_range layers(std::int64_t first, std::int64_t last);
  bert_range& with_embeddings() {
    embeddings = embeddings_part::included;
    return *this;
  }
  bert_range& with_head() {
    head = head_part::included;
    return *this;
  }

  bool has_embeddings() const { return embeddings == embeddings_part::included; }
  bool has_head() const { return head == head_part::included; }
  std::int64_t layer_count() const { return last_layer - first_layer; }
  // Embeddings require first_layer 0; a head requires last_layer == num_layers.
  status validate(const bert_config& cfg) const;
  std::string to_string() const;
};

} // namespace dsa::bert
