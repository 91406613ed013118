// Extractive QA generated from a corpus in SQuAD v1.1 layout, for the quick
// start and tests where real SQuAD cannot be downloaded: a question is a
// sentence of the paragraph with one content span (a name, a number, a date,
// a place, a content word) replaced by a wh-word; the answer is that span,
// with its exact answer_start in the paragraph. Deterministic for a seed.
#pragma once

#include "core/error.hpp"
#include "io/data/corpus.hpp"
#include "io/data/squad_dataset.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsa::data {

struct qa_gen_options {
  std::uint64_t seed = 12345;
  double dev_fraction = 0.1;       // share of documents (articles) in dev
  std::int64_t max_questions = 0;  // 0: no limit (train + dev)
  int questions_per_paragraph = 2; // at most, each from a different sentence
  int min_sentence_words = 5;
  int max_sentence_words = 60;
};

struct qa_gen_result {
  squad_dataset train;
  squad_dataset dev;
  std::int64_t by_kind[5] = {}; // questions by wh-word: who, what, when, where, how many
};

// The wh-word kinds, in qa_gen_result::by_kind order.
const char* qa_kind_name(int kind);

// One question for a sentence, or none: the span and its wh-word.
struct qa_candidate {
  std::size_t begin = 0; // byte range of the answer in the sentence
  std::size_t end = 0;
  std::size_t replace_begin = 0; // byte range replaced by the wh-word (may include a preposition)
  std::size_t replace_end = 0;
  int kind = 0;
  int priority = 0;         // higher is preferred
  const char* wh = nullptr; // the words replacing the span (qa_kind_name(kind) when null)
};
// All candidate spans of a sentence (exposed for tests).
std::vector<qa_candidate> qa_candidates(std::string_view sentence);
// The question text for a candidate: the sentence with the span replaced, ending in '?'.
std::string qa_question(std::string_view sentence, const qa_candidate& c);

// errc::invalid_argument when no question could be generated or options are out of range.
expected<qa_gen_result> generate_qa_from_corpus(const std::vector<document>& documents,
                                                const qa_gen_options& options);

} // namespace dsa::data
