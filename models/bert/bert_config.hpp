// BERT model configuration: named sizes (tiny .. large), dropout rates, LayerNorm
// placement, the task head and DeepSpeed's transformer-kernel memory flags.
// Parsed from the "model" table of a dsactor config; every error names the key.
#pragma once

#include "core/config.hpp"
#include "core/error.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace dsa::bert {

// tiny (2 layers, H 128, 2 heads), mini (4, 256, 4), small (4, 512, 8),
// medium (8, 512, 8), base (12, 768, 12), large (24, 1024, 16); custom takes
// num_layers / hidden_size / num_heads from the config.
enum class model_size { tiny, mini, small, medium, base, large, custom };

// post: the original BERT (LayerNorm after each residual add).
// pre: LayerNorm before each sublayer plus a final LayerNorm after the last
// layer (see parameter_specs.hpp for the names this adds).
enum class layer_norm_placement { post, pre };

// pretraining: MLM + NSP (HF BertForPreTraining); squad: span start/end logits
// (HF BertForQuestionAnswering, which has no pooler).
enum class head_kind { pretraining, squad };

// DeepSpeed transformer-kernel flags (its fused BERT layer). Each trades compute
// in backward for activation memory; results are identical with or without.
struct memory_flags {
  bool normalize_invertible = false;    // do not stash LayerNorm inputs (encoder layers)
  bool attn_dropout_checkpoint = false; // do not stash dropped-out attention probabilities
  bool gelu_checkpoint = false;         // do not stash the GELU output of the FFN
};

struct bert_config {
  model_size size = model_size::base;
  std::int64_t num_layers = 12;
  std::int64_t hidden_size = 768;
  std::int64_t num_heads = 12;
  std::int64_t intermediate_size = 3072; // 4 * hidden_size unless given
  std::int64_t vocab_size = 30522;
  std::int64_t max_position_embeddings = 512;
  std::int64_t type_vocab_size = 2;
  // Token whose word-embedding row gets no gradient from the lookup (HF
  // nn.Embedding padding_idx) and is initialised to zeros; -1: none.
  std::int64_t pad_token_id = 0;
  float hidden_dropout = 0.1f;
  float attention_dropout = 0.1f;
  float layer_norm_eps = 1e-12f;
  float initializer_range = 0.02f;
  layer_norm_placement norm = layer_norm_placement::post;
  head_kind head = head_kind::pretraining;
  memory_flags memory;
  // Activation checkpointing (Megatron's and BingBertSquad's checkpoint_activations, what
  // DeepSpeed's activation_checkpointing section configures): in a training forward each
  // encoder layer keeps only its f32 input, and the backward recomputes the layer's forward
  // (same dropout streams) before its backward; the results are identical.
  bool checkpoint_activations = false;

  std::int64_t head_size() const { return hidden_size / num_heads; }
  // Structural consistency (divisibility, positive sizes, dropout in [0, 1)).
  status validate() const;
};

// The named size with every other field at its default (intermediate 4H).
bert_config bert_config_for(model_size size);

const char* model_size_name(model_size size);
expected<model_size> parse_model_size(std::string_view name);

// Reads the table at `prefix` (usually "model"):
//   size = "tiny"|"mini"|"small"|"medium"|"base"|"large"|"custom"
//   num_layers, hidden_size, num_heads   (required for custom, else override the size)
//   intermediate_size, vocab_size, max_position_embeddings, type_vocab_size, pad_token_id,
//   hidden_dropout, attention_dropout, layer_norm_eps, initializer_range,
//   layer_norm = "post"|"pre", head = "pretraining"|"squad",
//   normalize_invertible, attn_dropout_checkpoint, gelu_checkpoint (booleans).
// Every problem is recorded in `problems`, naming the key (unknown keys with a
// suggestion), and reading goes on with the size's defaults.
bert_config read_bert_config(const config& cfg, config_problems& problems,
                             std::string_view prefix = "model");
// As read_bert_config, with every problem in one error.
expected<bert_config> parse_bert_config(const config& cfg, std::string_view prefix = "model");

// One line for the start-of-run log.
std::string describe(const bert_config& cfg);

} // namespace dsa::bert
