// Scaled, masked softmax over attention scores.
#pragma once

#include "core/dtype.hpp"
#include "core/philox.hpp"
#include "kernels/cpu/isa.hpp"

#include <cstdint>

namespace dsa::cpu {

// probs, scores: (batch, heads, tq, tk); key_mask: (batch, tk), 1 = attend, 0 = masked, or null.
// probs = softmax(scale * scores) over tk with masked keys given probability exactly 0.
// A row whose keys are all masked is all zeros. probs may alias scores.
void softmax_forward(float* probs, const float* scores, const float* key_mask, float scale,
                     std::int64_t batch, std::int64_t heads, std::int64_t tq, std::int64_t tk);

// dscores = scale * probs * (dprobs - sum_k(dprobs * probs)) (overwrite); rows = batch*heads*tq.
// dscores may alias dprobs.
void softmax_backward(float* dscores, const float* dprobs, const float* probs, float scale,
                      std::int64_t rows, std::int64_t tk);

// The two on a given path (at most the CPU's best): avx512 runs loops compiled for 16-lane
// vectors; scalar and avx2 run the build's loops.
void softmax_forward(isa path, float* probs, const float* scores, const float* key_mask, float scale,
                     std::int64_t batch, std::int64_t heads, std::int64_t tq, std::int64_t tk);
void softmax_backward(isa path, float* dscores, const float* dprobs, const float* probs, float scale,
                      std::int64_t rows, std::int64_t tk);
// The backward with the probabilities as stored (f32, f16 or bf16: a half stash read as it
// is, each row widened exactly first): the bits of the f32 form on the widened values.
void softmax_backward(isa path, float* dscores, const float* dprobs, const void* probs, dtype probs_type, float scale,
                      std::int64_t rows, std::int64_t tk);

// Attention probabilities and their dropout in one pass over the scores. Every output is
// optional (null) but one: probs (f32; may alias scores), probs_half (probs rounded to
// half_type, f16 or bf16), dropped (f32 dropout of probs, element i of the scores being
// element i of `stream`) and dropped_half (dropped rounded). The bits of softmax_forward, a
// cast, dropout_forward over the whole tensor and a cast. dropped outputs need p > 0.
struct softmax_dropout_out {
  float* probs = nullptr;
  std::uint16_t* probs_half = nullptr;
  float* dropped = nullptr;
  std::uint16_t* dropped_half = nullptr;
  dtype half_type = dtype::bf16;
};
void softmax_dropout_forward(isa path, const softmax_dropout_out& out, const float* scores, const float* key_mask,
                             float scale, float p, const philox_stream& stream, std::int64_t batch,
                             std::int64_t heads, std::int64_t tq, std::int64_t tk);
// The backward through both: ddropped (the gradient of the dropped probabilities) goes
// through the regenerated dropout mask, then the softmax backward (probabilities as stored,
// as above). The bits of dropout_forward on ddropped then softmax_backward; p == 0 is the
// softmax backward alone. dscores may alias ddropped.
void softmax_dropout_backward(isa path, float* dscores, const float* ddropped, const void* probs, dtype probs_type,
                              float scale, float p, const philox_stream& stream, std::int64_t rows,
                              std::int64_t tk);
// The same writing only dscores rounded to bf16 (nearest even), for products that read bf16.
void softmax_dropout_backward_bf16(isa path, std::uint16_t* dscores, const float* ddropped, const void* probs,
                                   dtype probs_type, float scale, float p, const philox_stream& stream,
                                   std::int64_t rows, std::int64_t tk);

void softmax_forward_ref(float* probs, const float* scores, const float* key_mask, float scale,
                         std::int64_t batch, std::int64_t heads, std::int64_t tq, std::int64_t tk);
void softmax_backward_ref(float* dscores, const float* dprobs, const float* probs, float scale,
                          std::int64_t rows, std::int64_t tk);

} // namespace dsa::cpu
