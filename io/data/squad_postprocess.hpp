// SQuAD post-processing with the reference run_squad's write_predictions:
// the n best start and end logits of every window, invalid spans skipped,
// the best non-null span over all windows of an example, mapped back to the
// original text with get_final_text's whitespace and casing recovery.
#pragma once

#include "core/error.hpp"
#include "io/data/squad_features.hpp"
#include "models/tokenizer/bert_tokenizer.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsa::data {

// The model's output for one feature: logits over its max_seq_length positions.
struct squad_raw_result {
  std::int64_t unique_id = 0;
  std::vector<float> start_logits;
  std::vector<float> end_logits;
};

struct squad_postprocess_options {
  int n_best_size = 20;
  int max_answer_length = 30;
  tok::tokenizer_options
      basic; // the model tokenizer's options (lower-casing decides get_final_text)
};

struct squad_nbest_entry {
  std::string text;
  double start_logit = 0.0;
  double end_logit = 0.0;
  double probability = 0.0; // softmax of start + end logits over the n best
};

struct squad_prediction {
  std::string qas_id;
  std::string text; // the best entry's text ("empty" when no span is valid, as the reference)
  std::vector<squad_nbest_entry> nbest;
};

// One prediction per example, in example order. errc::invalid_argument when a
// feature has no result or logits shorter than its tokens.
expected<std::vector<squad_prediction>> squad_postprocess(
    const std::vector<squad_example>& examples, const std::vector<squad_feature>& features,
    const std::vector<squad_raw_result>& results, const squad_postprocess_options& options);

// run_squad's get_final_text: projects `pred_text` (de-tokenized WordPiece
// text) onto `orig_text` (the original words joined by spaces) by aligning
// the basic tokenization of orig_text with orig_text without spaces; returns
// orig_text when the alignment fails.
std::string squad_get_final_text(std::string_view pred_text, std::string_view orig_text,
                                 const tok::tokenizer_options& basic);

// {id: answer} in example order, indented by 4 with ASCII escapes as Python's json.dump.
std::string squad_predictions_json(const std::vector<squad_prediction>& predictions);
// {id: [{text, probability, start_logit, end_logit}, ...]}
std::string squad_nbest_json(const std::vector<squad_prediction>& predictions);
// Replaces `path` atomically.
status write_squad_predictions(const std::string& path,
                               const std::vector<squad_prediction>& predictions);

} // namespace dsa::data
