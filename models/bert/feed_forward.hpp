// BERT position-wise feed-forward: intermediate.dense, GELU, output.dense
// (before the sublayer's dropout/residual, which encoder_layer applies).
#pragma once

#include "core/tensor.hpp"
#include "models/bert/bert_config.hpp"
#include "models/bert/bert_parameters.hpp"
#include "models/bert/linear.hpp"

#include <cstdint>

namespace dsa::bert {

// In the forward's stash dtype (f32, f16 or bf16). gelu is left undefined under
// gelu_checkpoint and recomputed from ff1 in backward.
struct feed_forward_stash {
  tensor x;    // (rows, H) input, set by the caller (the encoder layer)
  tensor ff1;  // (rows, I) intermediate.dense output = GELU input
  tensor gelu; // (rows, I) GELU output = output.dense input
};

// out: (rows, H) = output.dense(gelu(intermediate.dense(x))) before output.dense's bias (the
// encoder layer adds it in its fused residual exit); x: (rows, H) f32; p: f32. Fills ff1 and
// gelu of the stash in stash_type.
void feed_forward_forward(float* out, feed_forward_stash& stash, const tensor& x,
                          const layer_params& p, const memory_flags& flags, dtype stash_type);

// dx: (rows, H) = or += per dx_mode; dout: (rows, H). Parameter gradients +=. p: f32;
// the stash is widened to f32 as it is used.
void feed_forward_backward(float* dx, const float* dout, const feed_forward_stash& stash,
                           const layer_params& p, write_mode dx_mode);

} // namespace dsa::bert
