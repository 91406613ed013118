// The GPU model's device bytes per micro-batch (models/bert/gpu_memory.hpp), by arithmetic:
// the stash counted array by array for a small layer, what each memory flag and activation
// checkpointing take away, what the head and the working precision add. The gpu suite sets
// the same figures against a device's pool (tests/gpu/test_gpu_memory_plan.cpp).
#include "models/bert/gpu_memory.hpp"

#include <doctest/doctest.h>

using namespace dsa;

namespace {

// B = 2, T = 8, H = 16, 2 heads, I = 64, vocabulary 100; dropout on.
bert::bert_config layer_config() {
  bert::bert_config cfg;
  cfg.num_layers = 2;
  cfg.hidden_size = 16;
  cfg.num_heads = 2;
  cfg.intermediate_size = 64;
  cfg.vocab_size = 100;
  cfg.attention_dropout = 0.1f;
  cfg.hidden_dropout = 0.1f;
  return cfg;
}

bert::gpu_micro_batch micro(std::int64_t elem_size) {
  bert::gpu_micro_batch mb;
  mb.batch = 2;
  mb.seq = 8;
  mb.predictions = 3;
  mb.elem_size = elem_size;
  return mb;
}

constexpr std::int64_t N = 16, NH = 16 * 16, NI = 16 * 64, S = 2 * 2 * 8 * 8;

} // namespace

TEST_CASE("gpu layer stash: post-LN counted array by array, and what each memory flag saves") {
  bert::bert_config cfg = layer_config();
  for (const std::int64_t e : {4, 2}) {
    CAPTURE(e);
    // q, k, v, context, h, sum_a, sum_o; probs and dropped; ff1 and gelu; four statistics.
    const std::int64_t plain = (7 * NH + 2 * S + 2 * NI) * e + 4 * N * 4;
    CHECK(bert::gpu_layer_stash_bytes(cfg, micro(e)) == plain);
    bert::bert_config flagged = cfg;
    flagged.memory.gelu_checkpoint = true;
    CHECK(plain - bert::gpu_layer_stash_bytes(flagged, micro(e)) == NI * e);
    flagged = cfg;
    flagged.memory.attn_dropout_checkpoint = true;
    CHECK(plain - bert::gpu_layer_stash_bytes(flagged, micro(e)) == S * e);
    flagged.attention_dropout = 0.0f; // nothing dropped out: the flag has nothing to save
    bert::bert_config no_dropout = cfg;
    no_dropout.attention_dropout = 0.0f;
    CHECK(bert::gpu_layer_stash_bytes(flagged, micro(e)) == bert::gpu_layer_stash_bytes(no_dropout, micro(e)));
    CHECK(plain - bert::gpu_layer_stash_bytes(no_dropout, micro(e)) == S * e);
    flagged = cfg;
    flagged.memory.normalize_invertible = true; // both LayerNorms' inputs
    CHECK(plain - bert::gpu_layer_stash_bytes(flagged, micro(e)) == 2 * NH * e);
  }
}

TEST_CASE("gpu layer stash: pre-LN keeps the attention's normalized input and the residual stream") {
  bert::bert_config cfg = layer_config();
  cfg.norm = bert::layer_norm_placement::pre;
  // q, k, v, context, h, a_in, sum_o.
  const std::int64_t plain = (7 * NH + 2 * S + 2 * NI) * 4 + 4 * N * 4;
  CHECK(bert::gpu_layer_stash_bytes(cfg, micro(4)) == plain);
  cfg.memory.normalize_invertible = true; // only LN_o's input (sum_o)
  CHECK(plain - bert::gpu_layer_stash_bytes(cfg, micro(4)) == NH * 4);
}

TEST_CASE("gpu layer scratch: the attention backward's ten row arrays and scores dominate a small layer") {
  bert::bert_config cfg = layer_config();
  CHECK(bert::gpu_layer_backward_scratch(cfg, micro(4)) == (10 * NH + S) * 4);
  cfg.memory.attn_dropout_checkpoint = true; // the dropout applied again
  CHECK(bert::gpu_layer_backward_scratch(cfg, micro(4)) == (10 * NH + 2 * S) * 4);
  // The feed-forward's two gradients of the intermediate width take over when it is wide.
  cfg = layer_config();
  cfg.intermediate_size = 1024;
  const std::int64_t wide = 16 * 1024;
  CHECK(bert::gpu_layer_backward_scratch(cfg, micro(4)) == (2 * NH + 2 * wide) * 4);
  // Forward: the f32 product of Q, K or V, or the branch with the GELU output not stashed.
  cfg = layer_config();
  CHECK(bert::gpu_layer_forward_scratch(cfg, micro(2)) == NH * 4);
  cfg.memory.gelu_checkpoint = true;
  CHECK(bert::gpu_layer_forward_scratch(cfg, micro(2)) == (NH + NI) * 2);
  // Pre-LN under normalize_invertible: the residual stream lives beside the branch until the layer ends.
  cfg.norm = bert::layer_norm_placement::pre;
  cfg.memory.normalize_invertible = true;
  CHECK(bert::gpu_layer_forward_scratch(cfg, micro(2)) == (2 * NH + NI) * 2);
}

TEST_CASE("gpu part stash: layers' stashes gone under checkpointing, the head's logits in f32") {
  const bert::bert_config cfg = layer_config();
  const bert::bert_range whole = bert::bert_range::whole(cfg);
  const std::int64_t layer = bert::gpu_layer_stash_bytes(cfg, micro(2));
  const std::int64_t full = bert::gpu_part_stash_bytes(cfg, whole, micro(2));
  bert::bert_config ckpt = cfg;
  ckpt.checkpoint_activations = true;
  CHECK(full - bert::gpu_part_stash_bytes(ckpt, whole, micro(2)) == 2 * layer);
  // The MLM logits: M = B x predictions rows of the vocabulary, f32 whatever the storage.
  bert::gpu_micro_batch more = micro(2);
  more.predictions = 4;
  const std::int64_t per_row = 100 * 4 + 8 + 4 + 4 * 16 * 2 + 2 * 4 + 2 * 4;
  CHECK(bert::gpu_part_stash_bytes(cfg, whole, more) - full == 2 * per_row);
  // A middle stage: its input, each layer's output and stash, the mask; no head, no tables.
  bert::bert_config deep = layer_config();
  deep.num_layers = 3;
  const auto middle = bert::bert_range::layers(1, 2);
  CHECK(bert::gpu_part_stash_bytes(deep, middle, micro(2)) ==
        N * 4 + NH * 2 + NH * 2 + bert::gpu_layer_stash_bytes(deep, micro(2)));
  // Deterministic mode adds the embedding tables' row groups on the first stage only.
  bert::gpu_micro_batch det = micro(2);
  det.deterministic = true;
  CHECK(bert::gpu_part_stash_bytes(cfg, whole, det) - full == 3 * (3 * N + 1) * 4);
  CHECK(bert::gpu_part_stash_bytes(deep, middle, det) == bert::gpu_part_stash_bytes(deep, middle, micro(2)));
}

TEST_CASE("gpu part scratch: checkpointing holds a layer's recomputed stash; half storage copies the logits") {
  const bert::bert_config cfg = layer_config();
  const bert::bert_range whole = bert::bert_range::whole(cfg);
  bert::bert_config ckpt = cfg;
  ckpt.checkpoint_activations = true;
  const std::int64_t plain = bert::gpu_part_scratch_bytes(cfg, whole, micro(4));
  CHECK(bert::gpu_part_scratch_bytes(ckpt, whole, micro(4)) - plain ==
        NH * 4 + bert::gpu_layer_stash_bytes(cfg, micro(4)));
  // The head's backward with half storage: a half copy of the f32 logits' gradient.
  bert::bert_config wide_vocab = cfg;
  wide_vocab.vocab_size = 30000;
  const std::int64_t M = 2 * 3;
  CHECK(bert::gpu_part_scratch_bytes(wide_vocab, whole, micro(2)) == NH * 2 + M * 30000 * 2 + 3 * M * 16 * 2);
  CHECK(bert::gpu_part_scratch_bytes(wide_vocab, whole, micro(4)) < bert::gpu_part_scratch_bytes(wide_vocab, whole, micro(2)));
}
