// Pre-training instances (BERT sentence pairs with masked LM targets) and
// masking as Google's create_pretraining_data does it.
#pragma once

#include "io/data/pretrain_rng.hpp"
#include "models/tokenizer/bert_tokenizer.hpp"

#include <cstdint>
#include <vector>

namespace dsa::data {

// One unpadded instance: [CLS] A [SEP] B [SEP].
struct pretrain_instance {
  std::vector<std::int32_t> input_ids;           // after masking
  std::vector<std::int32_t> token_type_ids;      // 0 for [CLS] A [SEP], 1 for B [SEP]
  std::vector<std::int32_t> masked_lm_positions; // ascending
  std::vector<std::int32_t> masked_lm_ids;       // the original ids at those positions
  std::int32_t next_sentence_label = 0;          // 0 = B follows A, 1 = B is random (as BERT)
};

enum class word_masking : std::uint8_t { per_token, whole_word };

struct masking_options {
  double masked_lm_prob = 0.15;
  int max_predictions = 20;
  word_masking mode = word_masking::per_token;
};

// The token facts masking needs, taken once from a vocabulary.
struct masking_vocab {
  std::int32_t cls_id = 0, sep_id = 0, mask_id = 0, pad_id = 0;
  std::vector<std::uint8_t> is_continuation; // by id: token starts with "##"
  std::vector<std::int32_t> random_ids;      // replacement candidates: every non-[bracketed] token

  static masking_vocab from(const tok::vocab& v);
};

// Chooses the masked positions of `instance` (whose input_ids hold the original
// tokens) and rewrites input_ids, masked_lm_positions and masked_lm_ids. As
// Google's create_masked_lm_predictions: candidates are all tokens except [CLS]
// and [SEP] (with whole-word masking, a "##" token joins the word before it),
// visited in random order; num_to_predict = min(max_predictions,
// max(1, round(len(tokens) * masked_lm_prob))) with len counting the special tokens;
// a whole word that would overshoot is skipped. Each chosen token becomes
// [MASK] with probability 0.8, stays with 0.1, and becomes a uniformly random
// non-special token with 0.1 (Google draws from the whole vocabulary).
void mask_instance(pretrain_instance& instance, const masking_vocab& vocab,
                   const masking_options& options, prep_rng& rng);

// Undoes masking: writes masked_lm_ids back into input_ids and clears the targets.
void unmask_instance(pretrain_instance& instance);

} // namespace dsa::data
