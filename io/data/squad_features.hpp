// SQuAD examples and model features with the semantics of the reference
// run_squad (Google BERT's run_squad.py, HuggingFace's legacy squad.py):
// whitespace words of the context with a character-to-word map, the answer's
// word span, WordPiece sub-tokens, the improved answer span, sliding windows
// of [CLS] query [SEP] doc-window [SEP] with token_is_max_context, and answers
// outside a window labelled at position 0 ([CLS]).
#pragma once

#include "core/error.hpp"
#include "io/data/squad_dataset.hpp"
#include "models/tokenizer/bert_tokenizer.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dsa::data {

// training: label the first answer's span, found in the context with
// squad_locate_answer (examples whose answer is not in the context, or cannot
// be recovered from the whitespace words, are skipped and counted);
// evaluation: no labels, answers are not looked at.
enum class squad_mode : std::uint8_t { training, evaluation };

// The whitespace words of one context, shared by the questions of its paragraph.
struct squad_context_words {
  std::vector<std::string> doc_tokens;           // run_squad's is_whitespace split
  std::vector<std::int32_t> char_to_word_offset; // per context code point: index of its word
};

struct squad_example {
  std::string qas_id;
  std::string question_text;
  std::shared_ptr<const squad_context_words> words;
  std::string orig_answer_text;     // training: the first answer
  std::int32_t start_position = -1; // training: word index of the answer's first word
  std::int32_t end_position = -1;   // training: word index of the answer's last word

  const std::vector<std::string>& doc_tokens() const { return words->doc_tokens; }
};

struct squad_examples {
  std::vector<squad_example> examples;
  std::int64_t skipped = 0;   // training: questions left out, for either reason below
  std::int64_t not_found = 0; // training: of those, answer text not in the context at all
  std::int64_t moved = 0;     // training: answers labelled where found, not at answer_start
};

// run_squad's whitespace: ' ', '\t', '\r', '\n' and U+202F (not all of Unicode's).
bool squad_is_whitespace(char32_t c);
// Splits a context into doc_tokens and char_to_word_offset (per code point).
void squad_split_context(std::string_view context, std::vector<std::string>& doc_tokens,
                         std::vector<std::int32_t>& char_to_word_offset);

// One example per question, in file order.
squad_examples squad_read_examples(const squad_dataset& dataset, squad_mode mode);

struct squad_feature_options {
  int max_seq_length = 384;
  int doc_stride = 128;
  int max_query_length = 64;
  squad_mode mode = squad_mode::evaluation;
  std::int64_t first_unique_id = 1000000000;
};

// One window of one example. Per-position arrays have max_seq_length entries;
// `tokens` has only the real (unpadded) tokens.
struct squad_feature {
  std::int64_t unique_id = 0;
  std::int32_t example_index = 0;
  std::int32_t doc_span_index = 0;
  std::vector<std::string> tokens;
  std::vector<std::int32_t>
      token_to_orig_map; // position -> word index in doc_tokens, -1 outside the window
  std::vector<std::uint8_t>
      token_is_max_context;            // position -> 1 when this window is the token's best context
  std::vector<std::int32_t> input_ids; // padded with 0
  std::vector<std::int32_t> attention_mask; // 1 for real tokens
  std::vector<std::int32_t>
      token_type_ids;              // 0 for [CLS] query [SEP], 1 for the window and its [SEP]
  std::int32_t start_position = 0; // training: labels (0 = [CLS] when outside the window)
  std::int32_t end_position = 0;
};

// errc::invalid_argument when the options leave no room for the document
// (max_seq_length - query - 3 < 1) or doc_stride < 1.
expected<std::vector<squad_feature>>
squad_convert_examples(const std::vector<squad_example>& examples,
                       const tok::bert_tokenizer& tokenizer, const squad_feature_options& options);

// run_squad's _improve_answer_span: the smallest sub-token span inside
// [start, end] whose tokens join to the tokenized answer text.
void squad_improve_answer_span(const std::vector<std::string>& doc_sub_tokens, std::int32_t& start,
                               std::int32_t& end, const tok::bert_tokenizer& tokenizer,
                               std::string_view orig_answer_text);

struct squad_doc_span {
  std::int32_t start = 0;
  std::int32_t length = 0;
};
// The sliding windows over `doc_length` sub-tokens.
std::vector<squad_doc_span>
squad_doc_spans(std::int32_t doc_length, std::int32_t max_tokens_for_doc, std::int32_t doc_stride);
// run_squad's _check_is_max_context: the window where `position` has the
// highest min(left, right) context + 0.01 * window length (first one on ties).
bool squad_is_max_context(const std::vector<squad_doc_span>& spans, std::size_t span_index,
                          std::int32_t position);

} // namespace dsa::data
