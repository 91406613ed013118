// The GPU model's device bytes per micro-batch; see gpu_memory.hpp. Each count names the
// arrays of models/bert/cuda_layer.cpp or cuda_part.cpp it stands for.
#include "models/bert/gpu_memory.hpp"

#include <algorithm>

namespace dsa::bert {
namespace {

struct sizes {
  std::int64_t N, H, I, S, e; // rows, hidden, intermediate, attention scores, element bytes
  bool drop, pre;
};

sizes sizes_of(const bert_config& cfg, const gpu_micro_batch& mb) {
  const std::int64_t N = mb.batch * mb.seq;
  return {N,
          cfg.hidden_size,
          cfg.intermediate_size,
          mb.batch * cfg.num_heads * mb.seq * mb.seq,
          mb.elem_size,
          cfg.attention_dropout > 0.0f,
          cfg.norm == layer_norm_placement::pre};
}

} // namespace

std::int64_t gpu_layer_stash_bytes(const bert_config& cfg, const gpu_micro_batch& mb) {
  const sizes z = sizes_of(cfg, mb);
  const memory_flags& f = cfg.memory;
  // Rows x hidden arrays: q, k, v, context, h; pre-LN a_in and sum_o (sum_o freed under
  // normalize_invertible); post-LN sum_a and sum_o unless normalize_invertible.
  std::int64_t hidden_arrays = 5;
  if (z.pre) hidden_arrays += 1 + (f.normalize_invertible ? 0 : 1);
  else hidden_arrays += f.normalize_invertible ? 0 : 2;
  const std::int64_t stats = 4 * z.N * 4;                                        // mean_a, rstd_a, mean_o, rstd_o
  const std::int64_t scores = (1 + (z.drop && !f.attn_dropout_checkpoint ? 1 : 0)) * z.S; // probs, dropped
  const std::int64_t ffn = (1 + (f.gelu_checkpoint ? 0 : 1)) * z.N * z.I;         // ff1, gelu
  return (hidden_arrays * z.N * z.H + scores + ffn) * z.e + stats;
}

std::int64_t gpu_layer_forward_scratch(const bert_config& cfg, const gpu_micro_batch& mb) {
  const sizes z = sizes_of(cfg, mb);
  const memory_flags& f = cfg.memory;
  const std::int64_t product = z.N * z.H * 4; // Q, K, V's f32 product
  // The context per head, with the dropped-out probabilities when they are not stashed.
  const std::int64_t context = (z.N * z.H + (z.drop && f.attn_dropout_checkpoint ? z.S : 0)) * z.e;
  // The projections' output (`branch`), with the GELU output when it is not stashed, and
  // pre-LN under normalize_invertible the residual stream (sum_o), freed as the layer ends.
  const std::int64_t branch = (z.N * z.H + (f.gelu_checkpoint ? z.N * z.I : 0) +
                               (z.pre && f.normalize_invertible ? z.N * z.H : 0)) *
                              z.e;
  return std::max({product, context, branch});
}

std::int64_t gpu_layer_backward_scratch(const bert_config& cfg, const gpu_micro_batch& mb) {
  const sizes z = sizes_of(cfg, mb);
  const memory_flags& f = cfg.memory;
  const std::int64_t NH = z.N * z.H, NI = z.N * z.I;
  const std::int64_t pre = z.pre ? 1 : 0, rebuilt = f.normalize_invertible ? 1 : 0;
  // dh and dbranch live through the whole backward.
  const std::int64_t exit = (2 + (z.pre ? 0 : rebuilt)) * NH;                         // post-LN: LN_o's input rebuilt
  const std::int64_t ffn = (2 + pre) * NH + (2 + (f.gelu_checkpoint ? 1 : 0)) * NI;   // dffn_in, dgelu, dff1, GELU again
  const std::int64_t norm = (2 + pre + rebuilt) * NH;                                 // dffn_in, a LayerNorm input rebuilt
  // dcontext, dq, dk, dv, the four head-major gradients, dscores, the dropout again.
  const std::int64_t attention = 10 * NH + (1 + (z.drop && f.attn_dropout_checkpoint ? 1 : 0)) * z.S;
  const std::int64_t projections = (6 + pre) * NH; // dcontext, dq, dk, dv, pre-LN da
  return std::max({exit, ffn, norm, attention, projections}) * z.e;
}

namespace {

// The head's arrays in a part_stash (pre-training: the MLM rows and NSP; SQuAD: the span
// logits and labels).
std::int64_t head_stash_bytes(const bert_config& cfg, const gpu_micro_batch& mb) {
  const std::int64_t B = mb.batch, N = mb.batch * mb.seq, H = cfg.hidden_size, e = mb.elem_size;
  if (cfg.head == head_kind::squad) return 2 * N * 4 + 3 * 2 * B * 4; // logits; labels, losses, hits
  const std::int64_t M = mb.batch * mb.predictions;
  const std::int64_t mlm = M * 8 + M * 4 + 4 * M * H * e + 2 * M * 4 + M * cfg.vocab_size * 4 + 2 * M * 4;
  const std::int64_t nsp = B * 8 + B * 4 + B * H * e + B * H * 4 + B * H * e + B * 2 * 4 + 2 * B * 4;
  return mlm + nsp;
}

// The head's backward scratch: a half copy of the loss gradient and three (rows, H) arrays,
// the MLM rows' then the NSP rows'; SQuAD: the half copy of the span gradient.
std::int64_t head_backward_scratch(const bert_config& cfg, const gpu_micro_batch& mb) {
  const std::int64_t B = mb.batch, N = mb.batch * mb.seq, H = cfg.hidden_size, e = mb.elem_size;
  const std::int64_t half = e == 4 ? 0 : 1;
  if (cfg.head == head_kind::squad) return half * 2 * N * e;
  const std::int64_t M = mb.batch * mb.predictions;
  return std::max(half * M * cfg.vocab_size * e + 3 * M * H * e, half * 2 * B * e + 3 * B * H * e);
}

} // namespace

std::int64_t gpu_part_stash_bytes(const bert_config& cfg, const bert_range& range, const gpu_micro_batch& mb) {
  const std::int64_t N = mb.batch * mb.seq, NH = N * cfg.hidden_size, e = mb.elem_size;
  std::int64_t bytes = N * 4; // the key mask, f32
  if (range.has_embeddings()) {
    bytes += 2 * N * 4;               // ids, token types
    if (mb.deterministic) bytes += 3 * (3 * N + 1) * 4; // three tables' row groups: keys, offsets, order
    bytes += 2 * NH * e + 2 * N * 4;  // the output (acts[0]) and the LayerNorm's input, its statistics
  } else {
    bytes += NH * e; // the previous stage's output (acts[0])
  }
  bytes += range.layer_count() * NH * e; // each layer's output
  if (!cfg.checkpoint_activations) bytes += range.layer_count() * gpu_layer_stash_bytes(cfg, mb);
  if (range.has_head()) {
    if (cfg.norm == layer_norm_placement::pre) bytes += NH * e + 2 * N * 4; // the final LayerNorm
    bytes += head_stash_bytes(cfg, mb);
  }
  return bytes;
}

std::int64_t gpu_part_scratch_bytes(const bert_config& cfg, const bert_range& range, const gpu_micro_batch& mb) {
  const std::int64_t N = mb.batch * mb.seq, NH = N * cfg.hidden_size, e = mb.elem_size;
  std::int64_t forward = 0, backward = 0;
  // The gradient flowing in: the head's (owned by the part) or the next stage's, uploaded by
  // the CUDA stage and held through the backward.
  const std::int64_t incoming = NH * e;
  if (range.has_head()) backward = incoming + head_backward_scratch(cfg, mb);
  if (range.layer_count() > 0) {
    // Under checkpointing a layer's forward fills its stash, dropped as the layer ends.
    forward = gpu_layer_forward_scratch(cfg, mb) + (cfg.checkpoint_activations ? gpu_layer_stash_bytes(cfg, mb) : 0);
    const std::int64_t layer_backward = gpu_layer_backward_scratch(cfg, mb);
    // The gradient in hand and the next one (dprev); the next stage's gradient stays held.
    std::int64_t layer = incoming + 2 * NH * e;
    if (cfg.checkpoint_activations) // the layer's forward again: its output and stash, then its backward
      layer += NH * e + gpu_layer_stash_bytes(cfg, mb) + std::max(gpu_layer_forward_scratch(cfg, mb), layer_backward);
    else
      layer += layer_backward;
    backward = std::max(backward, layer);
  }
  if (range.has_embeddings() && mb.deterministic) // the ordered backward widens two arrays to f32
    backward = std::max(backward, incoming + NH * e + 2 * NH * 4);
  return std::max(forward, backward);
}

} // namespace dsa::bert
