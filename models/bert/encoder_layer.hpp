// One BERT encoder layer, post-LN (original BERT, HF) or pre-LN, with an
// activation stash shaped by the memory flags of bert_config:
//   post: h = LN_a(x + drop(attn(x)));       y = LN_o(h + drop(ffn(h)))
//   pre:  h = x + drop(attn(LN_a(x)));       y = h + drop(ffn(LN_o(h)))
// LN_a is attention.output.LayerNorm, LN_o output.LayerNorm. Dropout streams:
// (layer, site::attention_probs / attention_output / ffn_output).
#pragma once

#include "core/tensor.hpp"
#include "models/bert/attention.hpp"
#include "models/bert/bert_config.hpp"
#include "models/bert/bert_dropout.hpp"
#include "models/bert/bert_parameters.hpp"
#include "models/bert/feed_forward.hpp"

#include <cstddef>
#include <cstdint>

namespace dsa::bert {

struct layer_stash {
  forward_context ctx;
  std::int64_t layer = 0;
  attention_stash attention;
  feed_forward_stash feed_forward;
  // LN_a and LN_o. Under normalize_invertible the inputs and means are not kept;
  // backward works from the LayerNorm output (attention.x / feed_forward.x for
  // pre-LN and the post-LN LN_a, `output` for the post-LN LN_o).
  tensor norm_a_in, norm_a_mean, norm_a_rstd; // (N, H), (N), (N)
  tensor norm_o_in, norm_o_mean, norm_o_rstd;
  tensor output; // post-LN under normalize_invertible: y (N, H), shared with the next layer's input

  // Bytes of distinct tensors referenced (the layer input counts: it is held).
  std::size_t bytes() const;
};

// x: (B, T, H) f32; key_mask: (B, T) f32 or null. Returns y: (B, T, H).
// x_kept: the stash's copy of x when one exists already (the previous layer's
// `output`, post-LN under normalize_invertible), shared instead of copied again;
// undefined otherwise. Activations are stashed in ctx.stash_type. p: the layer's
// parameters in their stored dtype, widened to f32 while the layer runs.
// `layer` is the global layer index (it selects the dropout streams).
tensor encoder_layer_forward(const tensor& x, const tensor& x_kept, const float* key_mask,
                             const layer_params& p, const bert_config& cfg, std::int64_t layer,
                             const forward_context& ctx, layer_stash& stash);

// dy: (B, T, H). Returns dx: (B, T, H); parameter gradients (f32) +=. Stashed
// f16/bf16 activations and parameters are widened to f32 as they are used.
tensor encoder_layer_backward(const tensor& dy, const layer_stash& stash, const layer_params& p,
                              const bert_config& cfg);

// Bytes encoder_layer_forward stashes per layer for a (B, T) micro-batch in `mode`
// under cfg.memory, with activations in stash_type (per-row LayerNorm statistics
// stay f32); equals layer_stash::bytes() of a real forward (tested).
std::size_t layer_stash_bytes(const bert_config& cfg, std::int64_t batch, std::int64_t seq,
                              run_mode mode, dtype stash_type = dtype::f32);

} // namespace dsa::bert
