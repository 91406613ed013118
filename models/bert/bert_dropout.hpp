// Dropout inside BERT: Philox stream sites, the forward context, and apply /
// backward helpers. A mask is a pure function of (seed, step, micro_batch,
// layer, site), so backward regenerates the exact mask forward used instead of
// stashing it, on any rank and in any recompute. The forward context also says
// in which dtype a train-mode forward stashes its activations.
#pragma once

#include "core/dtype.hpp"
#include "core/philox.hpp"

#include <cstdint>

namespace dsa::bert {

// Values of philox_stream::site (< 256).
namespace site {
inline constexpr std::uint32_t embeddings = 0;       // after the embedding LayerNorm (layer 0)
inline constexpr std::uint32_t attention_probs = 1;  // attention probabilities, per layer
inline constexpr std::uint32_t attention_output = 2; // after the attention output projection
inline constexpr std::uint32_t ffn_output = 3;       // after the FFN output projection
inline constexpr std::uint32_t parameter_init = 255; // parameter initialisation (param_init.hpp)
} // namespace site

// What a forward pass draws its randomness from.
enum class run_mode { train, eval }; // eval: every dropout is the identity

struct forward_context {
  std::uint64_t seed = 0;
  std::uint32_t step = 0;
  std::uint32_t micro_batch = 0;
  run_mode mode = run_mode::train;
  // The stash's dtype for activations (f32, f16 or bf16; see stored_precision.hpp):
  // f16/bf16 copies are made on stash and widened to f32 in backward. Per-row
  // LayerNorm statistics and the heads' stashes stay f32.
  dtype stash_type = dtype::f32;

  philox_stream stream(std::uint32_t layer, std::uint32_t dropout_site) const {
    philox_stream s;
    s.seed = seed;
    s.step = step;
    s.micro_batch = micro_batch;
    s.layer = layer;
    s.site = dropout_site;
    return s;
  }
  // The rate actually applied: 0 in eval mode.
  float rate(float p) const { return mode == run_mode::train ? p : 0.0f; }
};

// y = dropout(x) with the stream's mask; a copy when p == 0 (y may alias x).
void dropout_apply(float* y, const float* x, float p, const philox_stream& stream, std::int64_t n);
// dx = dy * mask / (1 - p) with the regenerated mask; a copy when p == 0 (dx may alias dy).
void dropout_apply_backward(float* dx, const float* dy, float p, const philox_stream& stream,
                            std::int64_t n);

} // namespace dsa::bert
