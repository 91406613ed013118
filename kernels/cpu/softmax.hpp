// Scaled, masked softmax over attention scores.
#pragma once

#include "core/dtype.hpp"
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

void softmax_forward_ref(float* probs, const float* scores, const float* key_mask, float scale,
                         std::int64_t batch, std::int64_t heads, std::int64_t tq, std::int64_t tk);
void softmax_backward_ref(float* dscores, const float* dprobs, const float* probs, float scale,
                          std::int64_t rows, std::int64_t tk);

} // namespace dsa::cpu
