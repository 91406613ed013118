// BERT multi-head self-attention: Q, K, V projections, scaled masked softmax,
// attention-probability dropout, context, output projection (before the
// sublayer's own dropout/residual, which encoder_layer applies).
// Heads are addressed in place inside (B*T, H) rows (row stride H, head h at
// columns [h*d, (h+1)*d)), so no 0213 transposes are needed.
#pragma once

#include "core/tensor.hpp"
#include "models/bert/bert_config.hpp"
#include "models/bert/bert_dropout.hpp"
#include "models/bert/bert_parameters.hpp"
#include "models/bert/linear.hpp"

#include <cstdint>

namespace dsa::bert {

struct attention_dims {
  std::int64_t batch = 0, seq = 0, hidden = 0, heads = 0;
  std::int64_t rows() const { return batch * seq; }
  std::int64_t head_size() const { return hidden / heads; }
};

// What backward needs, in the forward's stash dtype (f32, f16 or bf16). probs_drop is
// left undefined (and recomputed from probs and the regenerated mask) under
// attn_dropout_checkpoint, and when no dropout is applied.
struct attention_stash {
  tensor x;          // (B*T, H) input, set by the caller (the encoder layer)
  tensor q, k, v;    // (B*T, H)
  tensor probs;      // (B, A, T, T) softmax output
  tensor probs_drop; // (B, A, T, T) after dropout
  tensor context;    // (B*T, H) input of the output projection
};

// out: (B*T, H) = output projection of the attention context of x: (B*T, H) f32, before the
// projection's bias (the encoder layer adds it in its fused residual exit).
// key_mask: (B, T) f32 1 = attend, or null. `stream` is the layer's attention_probs stream.
// p: f32. Fills the stash (except x) in stash_type.
void attention_forward(float* out, attention_stash& stash, const tensor& x, const float* key_mask,
                       const layer_params& p, const attention_dims& dims, float dropout_p,
                       const philox_stream& stream, const memory_flags& flags, dtype stash_type);

// dx: (B*T, H) = or += per dx_mode; dout: (B*T, H) gradient of out. Parameter gradients +=.
// p: f32; the stash is widened to f32 as it is used.
void attention_backward(float* dx, const float* dout, const attention_stash& stash,
                        const layer_params& p, const attention_dims& dims, float dropout_p,
                        const philox_stream& stream, write_mode dx_mode);

} // namespace dsa::bert
