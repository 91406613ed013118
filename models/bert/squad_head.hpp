// SQuAD span head (HF BertForQuestionAnswering): qa_outputs maps every token's
// hidden state to (start, end) logits; loss = (CE(start) + CE(end)) / 2, each
// the mean over counted sequences. As HF, label positions are clamped to
// [0, T] and T (an answer outside the window) is ignored.
#pragma once

#include "core/tensor.hpp"
#include "models/bert/bert_batch.hpp"
#include "models/bert/bert_config.hpp"
#include "models/bert/bert_parameters.hpp"

namespace dsa::bert {

struct squad_head_stash {
  tensor hidden;  // (B, T, H) input, a reference
  tensor dlogits; // (B*T, 2) d loss / d logits (undefined without labels)
};

struct squad_logits {
  tensor start, end; // (B, T) f32
};

// p: in the stored dtype, widened to f32 while the forward or the backward runs; the
// stash stays f32.
// hidden: (B, T, H). Loss pieces are zero when the batch has no start/end positions.
bert_losses squad_head_forward(const tensor& hidden, const bert_batch& batch,
                               const squad_head_params& p, squad_head_stash& stash,
                               squad_logits& logits);

// Returns d(loss_scale * total) / d hidden: (B, T, H); parameter gradients +=.
tensor squad_head_backward(const squad_head_stash& stash, const squad_head_params& p,
                           float loss_scale);

} // namespace dsa::bert
