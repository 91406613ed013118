// One micro-batch as BERT consumes it, and the loss pieces a head returns.
#pragma once

#include "core/tensor.hpp"
#include "models/bert/bert_config.hpp"
#include "models/bert/bert_range.hpp"

#include <cstdint>

namespace dsa::bert {

// Shapes: B sequences of T tokens, P masked-LM slots per sequence.
// Tensors a range does not need may be left undefined (a middle pipeline stage
// needs only attention_mask; the head needs the labels).
struct bert_batch {
  tensor input_ids;      // (B, T) i32, in [0, vocab_size)
  tensor token_type_ids; // (B, T) i32, in [0, type_vocab_size); undefined: all 0
  // (B, T) f32 (preferred: fed to the softmax as is) or i32; 1 = attend, 0 = padding.
  // Undefined: every token attends.
  tensor attention_mask;

  // Pretraining labels. A slot is ignored when its id is negative (-1) or its
  // position is 0 (position 0 is [CLS], never masked: the padding of
  // NVIDIA-style shards with zeros).
  tensor masked_lm_positions;  // (B, P) i32, in [0, T)
  tensor masked_lm_ids;        // (B, P) i32, in [0, vocab_size) or -1
  tensor next_sentence_labels; // (B) i32: 0 = is next, 1 = random, -1 = ignored

  // SQuAD labels: token indices of the answer span. As HF, positions are
  // clamped to [0, T] and T (outside the sequence) is ignored.
  tensor start_positions; // (B) i32
  tensor end_positions;   // (B) i32

  std::int64_t batch_size() const; // from input_ids or attention_mask
  std::int64_t seq_length() const;
};

// Dtypes, shapes and value ranges of what `range` will read; errors name the tensor
// and the first bad element. Positions of SQuAD labels are not range-checked (clamped).
status validate_batch(const bert_batch& batch, const bert_config& cfg, const bert_range& range);

// Loss pieces of one micro-batch. total is what backward differentiates:
// pretraining: mlm_loss + nsp_loss (HF BertForPreTraining);
// squad: (start_loss + end_loss) / 2 (HF BertForQuestionAnswering).
// Each piece is the mean over its counted rows (0 when none is counted).
struct bert_losses {
  double total = 0.0;
  double mlm_loss = 0.0, nsp_loss = 0.0;
  double start_loss = 0.0, end_loss = 0.0;
  std::int64_t mlm_count = 0, mlm_correct = 0;
  std::int64_t nsp_count = 0, nsp_correct = 0;
  std::int64_t start_count = 0, start_correct = 0;
  std::int64_t end_count = 0, end_correct = 0;
};

} // namespace dsa::bert
