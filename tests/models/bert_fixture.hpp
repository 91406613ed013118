// Small BERT shapes, batches and helpers shared by the model tests.
#pragma once

#include "models/bert/bert_part.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::test {

// 2 layers, H 16, 2 heads, I 32, vocab 50, positions 16; dropout off unless asked.
bert::bert_config small_bert(bert::layer_norm_placement norm, bert::head_kind head);

// B = 2, T = 7, P = 3: the second sequence has 2 padding tokens (mask 0),
// ids in [1, vocab) (no pad token), both token types, one padded MLM slot,
// SQuAD spans inside the window. Deterministic.
bert::bert_batch small_batch(const bert::bert_config& cfg);

tensor i32_tensor(const shape_t& shape, const std::vector<std::int32_t>& values);
tensor f32_tensor(const shape_t& shape, const std::vector<float>& values);

// Loss of a train-mode forward through `parts` in order (hidden handed along).
double chain_loss(const std::vector<const bert::bert_part*>& parts, const bert::bert_batch& batch,
                  const bert::forward_context& ctx);
// Forward + backward through `parts` (gradients accumulate); returns the loss pieces.
bert::bert_losses chain_step(const std::vector<bert::bert_part*>& parts,
                             const bert::bert_batch& batch, const bert::forward_context& ctx);

// Every tensor ~ N(0, 0.3) (LayerNorm gains 1 + N(0, 0.2)), keyed by name like the
// real init, rounded to the values' dtype: attention and GELU well inside their
// non-linear range, biases non-zero (the real init, std 0.02 and zero biases,
// leaves the model almost linear).
void randomize_parameters(bert::bert_parameters& params, std::uint64_t seed);

} // namespace dsa::test
