// Shape, dtype and range checks of a micro-batch before it reaches the kernels.
#include "models/bert/bert_batch.hpp"

namespace dsa::bert {
namespace {

status check_tensor(const tensor& t, const char* name, dtype type, const shape_t& shape) {
  if (!t.defined())
    return make_error(errc::invalid_argument, "bert batch: {} is missing", name);
  if (t.type() != type || t.shape() != shape || !t.is_contiguous())
    return make_error(errc::invalid_argument, "bert batch: {} should be contiguous {}{}, got {}",
                      name, dtype_name(type), shape_string(shape), t.describe());
  return {};
}

status check_values(const tensor& t, const char* name, std::int32_t low, std::int64_t high) {
  const std::int32_t* v = t.data<std::int32_t>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (v[i] < low || v[i] >= high)
      return make_error(errc::invalid_argument, "bert batch: {}[{}] = {} outside [{}, {})", name, i,
                        v[i], low, high);
  return {};
}

} // namespace

std::int64_t bert_batch::batch_size() const {
  if (input_ids.defined())
    return input_ids.dim(0);
  return attention_mask.defined() ? attention_mask.dim(0) : 0;
}

std::int64_t bert_batch::seq_length() const {
  if (input_ids.defined())
    return input_ids.dim(1);
  return attention_mask.defined() ? attention_mask.dim(1) : 0;
}

status validate_batch(const bert_batch& b, const bert_config& cfg, const bert_range& range) {
  const std::int64_t B = b.batch_size(), T = b.seq_length();
  if (B < 1 || T < 1)
    return make_error(errc::invalid_argument, "bert batch: empty (B {}, T {})", B, T);
  if (T > cfg.max_position_embeddings)
    return make_error(errc::invalid_argument,
                      "bert batch: sequence length {} > max_position_embeddings {}", T,
                      cfg.max_position_embeddings);
  if (b.attention_mask.defined()) {
    dtype mt = b.attention_mask.type() == dtype::i32 ? dtype::i32 : dtype::f32;
    DSA_TRY(check_tensor(b.attention_mask, "attention_mask", mt, {B, T}));
  }
  if (range.has_embeddings()) {
    DSA_TRY(check_tensor(b.input_ids, "input_ids", dtype::i32, {B, T}));
    DSA_TRY(check_values(b.input_ids, "input_ids", 0, cfg.vocab_size));
    if (b.token_type_ids.defined()) {
      DSA_TRY(check_tensor(b.token_type_ids, "token_type_ids", dtype::i32, {B, T}));
      DSA_TRY(check_values(b.token_type_ids, "token_type_ids", 0, cfg.type_vocab_size));
    }
  }
  if (!range.has_head())
    return {};
  if (cfg.head == head_kind::pretraining) {
    if (b.masked_lm_positions.defined() || b.masked_lm_ids.defined()) {
      DSA_TRY(
          check_tensor(b.masked_lm_positions, "masked_lm_positions", dtype::i32,
                       {B, b.masked_lm_positions.defined() ? b.masked_lm_positions.dim(-1) : 0}));
      const std::int64_t P = b.masked_lm_positions.dim(1);
      DSA_TRY(check_tensor(b.masked_lm_ids, "masked_lm_ids", dtype::i32, {B, P}));
      DSA_TRY(check_values(b.masked_lm_positions, "masked_lm_positions", 0, T));
      DSA_TRY(check_values(b.masked_lm_ids, "masked_lm_ids", -1, cfg.vocab_size));
    }
    if (b.next_sentence_labels.defined()) {
      DSA_TRY(check_tensor(b.next_sentence_labels, "next_sentence_labels", dtype::i32, {B}));
      DSA_TRY(check_values(b.next_sentence_labels, "next_sentence_labels", -1, 2));
    }
  } else {
    if (b.start_positions.defined() || b.end_positions.defined()) {
      DSA_TRY(check_tensor(b.start_positions, "start_positions", dtype::i32, {B}));
      DSA_TRY(check_tensor(b.end_positions, "end_positions", dtype::i32, {B}));
    }
  }
  return {};
}

} // namespace dsa::bert
