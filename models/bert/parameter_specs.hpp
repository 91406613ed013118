// Names, shapes and initialisation of every BERT parameter, with HuggingFace
// names and layouts (Linear weights are [out, in]). This list is the single
// source of truth for allocation, init, load_state and state.
//
// Names (L = layer index):
//   bert.embeddings.{word_embeddings,position_embeddings,token_type_embeddings}.weight
//   bert.embeddings.LayerNorm.{weight,bias}
//   bert.encoder.layer.L.attention.self.{query,key,value}.{weight,bias}
//   bert.encoder.layer.L.attention.output.dense.{weight,bias}
//   bert.encoder.layer.L.attention.output.LayerNorm.{weight,bias}
//   bert.encoder.layer.L.intermediate.dense.{weight,bias}
//   bert.encoder.layer.L.output.dense.{weight,bias}
//   bert.encoder.layer.L.output.LayerNorm.{weight,bias}
//   pretraining head: bert.pooler.dense.{weight,bias},
//     cls.predictions.transform.dense.{weight,bias},
//     cls.predictions.transform.LayerNorm.{weight,bias}, cls.predictions.bias,
//     cls.seq_relationship.{weight,bias} (the MLM decoder weight is the word embedding: no
//     parameter of its own)
//   squad head: qa_outputs.{weight,bias} (no pooler, as HF BertForQuestionAnswering)
//
// Pre-LN (not an HF architecture) keeps the same names: each sublayer's
// LayerNorm is applied to that sublayer's input instead of after its residual
// add (attention.output.LayerNorm before self-attention, output.LayerNorm before
// intermediate.dense), and adds bert.encoder.final_layernorm.{weight,bias}
// after the last layer. The final LayerNorm belongs to the range holding the head.
#pragma once

#include "core/tensor.hpp"
#include "models/bert/bert_config.hpp"
#include "models/bert/bert_range.hpp"

#include <string>
#include <vector>

namespace dsa::bert {

enum class init_kind {
  normal,          // N(0, initializer_range)
  normal_pad_zero, // N(0, initializer_range), row pad_token_id zero (word embeddings)
  zeros,
  ones,
};

// A range with a pretraining head but without the embeddings holds a copy of
// the tied word embedding: its gradient there is the decoder's contribution only,
// to be summed with the embedding stage's (DeepSpeed's tied-weight allreduce).
enum class replica { owner, tied_copy };

struct param_spec {
  std::string name;
  shape_t shape;
  init_kind init = init_kind::normal;
  replica role = replica::owner;
};

inline const char* word_embeddings_name() {
  return "bert.embeddings.word_embeddings.weight";
}
inline const char* position_embeddings_name() {
  return "bert.embeddings.position_embeddings.weight";
}
std::string layer_prefix(std::int64_t layer); // "bert.encoder.layer.L."

// The parameters a range holds, in canonical order: embeddings, layers in order,
// then the head (tied word-embedding copy first when it applies).
std::vector<param_spec> parameter_specs(const bert_config& cfg, const bert_range& range);
// Sum of element counts, counting a tied copy like any other tensor.
std::int64_t parameter_count(const std::vector<param_spec>& specs);

} // namespace dsa::bert
