// BERT pretraining head (HF BertForPreTraining): masked-LM over the labelled
// masked positions only, and next-sentence prediction from the pooled [CLS].
//   MLM:  u = LN(gelu(transform.dense(h[pos]))), logits = u W_word^T + cls.predictions.bias
//   NSP:  logits = seq_relationship(tanh(pooler.dense(h[:, 0])))
// total = mean CE(MLM) + mean CE(NSP). The decoder adds its contribution to the
// tied word-embedding gradient of the head's range.
#pragma once

#include "core/tensor.hpp"
#include "models/bert/bert_batch.hpp"
#include "models/bert/bert_config.hpp"
#include "models/bert/bert_parameters.hpp"

#include <cstdint>
#include <vector>

namespace dsa::bert {

struct pretraining_head_stash {
  shape_t hidden_shape;                  // (B, T, H)
  std::vector<std::int64_t> masked_rows; // row b*T + position of each counted MLM slot (M of them)
  tensor masked;                         // (M, H) gathered hidden rows
  tensor transform, gelu;                // (M, H) dense output, GELU output (= LayerNorm input)
  tensor norm_mean, norm_rstd;           // (M)
  tensor normed;                         // (M, H) decoder input
  tensor mlm_dlogits;                    // (M, V) d mean-CE / d logits
  tensor cls, pooled;                    // (B, H) [CLS] rows, tanh output
  tensor nsp_dlogits;                    // (B, 2)
};

// The head's stash stays f32 whatever the forward's stash_type: d mean-CE / d logits
// (M, V) is stashed before the loss scale applies and would underflow in f16.
// p: in the stored dtype, widened to f32 (the tied word embedding too) while the
// forward or the backward runs.
// hidden: (B, T, H). MLM is skipped when the batch has no masked_lm tensors, NSP
// when it has no next_sentence_labels.
bert_losses pretraining_head_forward(const tensor& hidden, const bert_batch& batch,
                                     const pretraining_head_params& p, const bert_config& cfg,
                                     pretraining_head_stash& stash);

// Returns d(loss_scale * total) / d hidden: (B, T, H); parameter gradients +=.
// Consumes the stash's logits gradients: they are scaled by loss_scale in place
// (a 5 MiB copy per micro-batch at BERT-mini's vocabulary otherwise).
tensor pretraining_head_backward(pretraining_head_stash& stash,
                                 const pretraining_head_params& p, const bert_config& cfg,
                                 float loss_scale);

} // namespace dsa::bert
