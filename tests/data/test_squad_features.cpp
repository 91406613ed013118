// SQuAD features on crafted contexts: whitespace words, sub-token mapping,
// windows over a doc-stride boundary, token_is_max_context, [CLS] labels.
#include "io/data/squad_features.hpp"

#include <doctest/doctest.h>

using namespace dsa::data;
using dsa::tok::bert_tokenizer;
using dsa::tok::vocab;

namespace {

bert_tokenizer small_tokenizer() {
  return bert_tokenizer(vocab::from_tokens(
      {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "q",    "one", "two",    "three",  "four",
       "five",  "six",   "seven", "eight", "##een",  "nine", "ten", "eleven", "twelve", "(",
       ")",     "-",     ".",     "1895",  "1943",   "born", "he",  "was",    "?",      "when"}));
}

// A one-question data set whose first answer is `answer` found in `context`.
squad_dataset one_question(const std::string& context, const std::string& question,
                           const std::string& answer, std::int64_t answer_start) {
  squad_dataset d;
  d.articles.resize(1);
  d.articles[0].title = "t";
  d.articles[0].paragraphs.resize(1);
  d.articles[0].paragraphs[0].context = context;
  squad_question q{"q0", question, {{answer, answer_start, 0}}};
  d.articles[0].paragraphs[0].qas.push_back(q);
  return d;
}

} // namespace

TEST_CASE("squad context split: whitespace words and char_to_word_offset per code point") {
  std::vector<std::string> words;
  std::vector<std::int32_t> offsets;
  // two leading spaces, "a", two spaces, "b", tab, "c", U+202F, "d\u00e9", NBSP is not whitespace
  // here.
  squad_split_context("  a  b\tc\xE2\x80\xAF"
                      "d\xC3\xA9\xC2\xA0x",
                      words, offsets);
  REQUIRE(words.size() == 4);
  CHECK(words[0] == "a");
  CHECK(words[2] == "c");
  CHECK(words[3] == "d\xC3\xA9\xC2\xA0x");
  std::vector<std::int32_t> expected{-1, -1, 0, 0, 0, 1, 1, 2, 2, 3, 3, 3, 3};
  CHECK(offsets == expected);
}

TEST_CASE("squad examples: answer word span; unrecoverable answers skipped in training") {
  const std::string context = "He was born (1895-1943). Then";
  auto d = one_question(context, "when", "1895", 13);
  auto ex = squad_read_examples(d, squad_mode::training);
  REQUIRE(ex.examples.size() == 1);
  CHECK(ex.examples[0].start_position == 3);
  CHECK(ex.examples[0].end_position == 3);
  CHECK(ex.examples[0].doc_tokens()[3] == "(1895-1943).");
  // "born (1895" spans two words.
  d = one_question(context, "when", "born (1895", 7);
  ex = squad_read_examples(d, squad_mode::training);
  REQUIRE(ex.examples.size() == 1);
  CHECK(ex.examples[0].start_position == 2);
  CHECK(ex.examples[0].end_position == 3);
  // An answer whose words, split on all Unicode whitespace, are not in the run_squad words
  // that cover it (U+00A0 is whitespace to str.split, not to run_squad) is skipped, as the
  // reference warns and skips.
  d = one_question("He was born\xC2\xA0(1895-1943).", "when", "born\xC2\xA0(1895", 7);
  ex = squad_read_examples(d, squad_mode::training);
  CHECK(ex.examples.empty());
  CHECK(ex.skipped == 1);
  CHECK(ex.not_found == 0);
  ex = squad_read_examples(d, squad_mode::evaluation);
  CHECK(ex.examples.size() == 1);
  CHECK(ex.examples[0].start_position == -1);
}

TEST_CASE("squad examples: training finds answers away from answer_start, or skips and counts") {
  squad_dataset d =
      one_question("He was born (1895-1943). Then he LEFT  home.", "when", "Then", 20);
  auto& qas = d.articles[0].paragraphs[0].qas;
  qas.push_back({"case", "what", {{"left home", 30, 0}}});               // case and spacing differ
  qas.push_back({"absent", "what", {{"Paris", 3, 0}}});                  // not in the context
  qas.push_back({"second", "when", {{"1943", -1, 0}, {"1895", 13, 0}}}); // only the first counts
  qas.push_back({"exact", "when", {{"1895", 13, 0}}});
  auto ex = squad_read_examples(d, squad_mode::training);
  CHECK(ex.moved == 3);
  CHECK(ex.not_found == 1);
  CHECK(ex.skipped == 1);
  REQUIRE(ex.examples.size() == 4);
  CHECK(ex.examples[0].qas_id == "q0");
  CHECK(ex.examples[0].start_position == 4); // "Then", found at 25
  CHECK(ex.examples[0].end_position == 4);
  CHECK(ex.examples[1].qas_id == "case");
  CHECK(ex.examples[1].orig_answer_text == "LEFT  home"); // the context's own text
  CHECK(ex.examples[1].start_position == 6);
  CHECK(ex.examples[1].end_position == 7);
  CHECK(ex.examples[2].qas_id == "second");
  CHECK(ex.examples[2].orig_answer_text == "1943"); // inside the word "(1895-1943)."
  CHECK(ex.examples[2].start_position == 3);
  CHECK(ex.examples[3].qas_id == "exact");
  CHECK(ex.examples[3].start_position == 3);
  // Evaluation looks at no answer: every question is kept.
  CHECK(squad_read_examples(d, squad_mode::evaluation).examples.size() == 5);
}

TEST_CASE("squad features: improved answer span inside one word") {
  auto d = one_question("He was born (1895-1943). Then", "when", "1895", 13);
  auto ex = squad_read_examples(d, squad_mode::training);
  squad_feature_options o;
  o.mode = squad_mode::training;
  auto features = squad_convert_examples(ex.examples, small_tokenizer(), o);
  REQUIRE(features);
  REQUIRE(features->size() == 1);
  const auto& f = (*features)[0];
  // [CLS] when [SEP] he was born ( 1895 - 1943 ) . [UNK] [SEP]
  REQUIRE(f.tokens.size() == 14);
  CHECK(f.tokens[7] == "1895");
  CHECK(f.start_position == 7);
  CHECK(f.end_position == 7);
  CHECK(f.tokens[12] == "[UNK]"); // "then" is not in the vocabulary
  CHECK(f.token_to_orig_map[7] == 3);
  CHECK(f.token_to_orig_map[12] == 4);
  CHECK(f.token_to_orig_map[2] == -1);
  CHECK(f.input_ids.size() == 384);
  CHECK(f.input_ids[0] == 2);
  CHECK(f.input_ids[13] == 3);
  CHECK(f.input_ids[14] == 0);
  CHECK(f.attention_mask[13] == 1);
  CHECK(f.attention_mask[14] == 0);
  CHECK(f.token_type_ids[2] == 0);
  CHECK(f.token_type_ids[3] == 1);
  CHECK(f.token_type_ids[13] == 1);
  CHECK(f.token_type_ids[14] == 0);
}

TEST_CASE("squad features: answer straddling a doc-stride boundary") {
  const std::string context = "one two three four five six seven eighteen nine ten eleven twelve";
  // "five six seven" = sub-tokens 4..6; "eighteen" = eight ##een (sub-tokens 7, 8); 13 sub-tokens.
  auto d = one_question(context, "q", "five six seven", 19);
  auto ex = squad_read_examples(d, squad_mode::training);
  REQUIRE(ex.examples.size() == 1);
  squad_feature_options o;
  o.max_seq_length = 10; // 10 - 1 query token - 3 = 6 document tokens per window
  o.doc_stride = 3;
  o.mode = squad_mode::training;
  auto features = squad_convert_examples(ex.examples, small_tokenizer(), o);
  REQUIRE(features);
  // Windows [0..5], [3..8], [6..11], [9..12].
  REQUIRE(features->size() == 4);
  const auto& f = *features;
  CHECK(f[0].unique_id == 1000000000);
  CHECK(f[3].unique_id == 1000000003);
  CHECK(f[1].doc_span_index == 1);
  CHECK(f[3].tokens.size() == 3 + 4 + 1);
  // Only window 1 holds the whole answer: doc offset 3 (after [CLS] q [SEP]).
  CHECK(f[0].start_position == 0);
  CHECK(f[0].end_position == 0);
  CHECK(f[1].start_position == 4 - 3 + 3);
  CHECK(f[1].end_position == 6 - 3 + 3);
  CHECK(f[1].tokens[4] == "five");
  CHECK(f[1].tokens[6] == "seven");
  CHECK(f[2].start_position == 0);
  CHECK(f[3].end_position == 0);
  // Sub-token 4 (five): window 0 scores min(4, 1) + 0.06, window 1 min(1, 4) + 0.06: the tie goes
  // to window 0.
  CHECK(f[0].token_is_max_context[3 + 4] == 1);
  CHECK(f[1].token_is_max_context[3 + 1] == 0);
  // Sub-token 5 (six): window 0 min(5, 0), window 1 min(2, 3): window 1.
  CHECK(f[0].token_is_max_context[3 + 5] == 0);
  CHECK(f[1].token_is_max_context[3 + 2] == 1);
  // Sub-token 8 (##een of word 7): window 1 min(5, 0), window 2 min(2, 3): window 2.
  CHECK(f[1].tokens[3 + 5] == "##een");
  CHECK(f[1].token_to_orig_map[3 + 5] == 7);
  CHECK(f[1].token_is_max_context[3 + 5] == 0);
  CHECK(f[2].token_is_max_context[3 + 2] == 1);
  CHECK(f[2].token_to_orig_map[3 + 2] == 7);
  // The last window's tokens 11, 12: window 3 is the only one holding 12.
  CHECK(f[3].token_is_max_context[3 + 3] == 1);
  CHECK(f[3].token_to_orig_map[3 + 3] == 11);
  CHECK(squad_is_max_context(squad_doc_spans(13, 6, 3), 0, 3));
  CHECK_FALSE(squad_is_max_context(squad_doc_spans(13, 6, 3), 1, 3));
}

TEST_CASE("squad features: answer at the end of the context, evaluation mode, bad options") {
  const std::string context = "one two three four five six seven eighteen nine ten eleven twelve";
  auto d = one_question(context, "q", "eleven twelve", 52);
  auto ex = squad_read_examples(d, squad_mode::training);
  REQUIRE(ex.examples.size() == 1);
  squad_feature_options o;
  o.max_seq_length = 10;
  o.doc_stride = 3;
  o.mode = squad_mode::training;
  auto features = squad_convert_examples(ex.examples, small_tokenizer(), o);
  REQUIRE(features);
  REQUIRE(features->size() == 4);
  CHECK((*features)[2].start_position == 0); // window [6..11] misses sub-token 12
  CHECK((*features)[3].start_position == 11 - 9 + 3);
  CHECK((*features)[3].end_position == 12 - 9 + 3);

  o.mode = squad_mode::evaluation;
  auto eval_examples = squad_read_examples(d, squad_mode::evaluation);
  features = squad_convert_examples(eval_examples.examples, small_tokenizer(), o);
  REQUIRE(features);
  CHECK((*features)[3].start_position == 0);

  o.max_seq_length = 4; // [CLS] q [SEP] [SEP] leaves no document token
  CHECK_FALSE(squad_convert_examples(eval_examples.examples, small_tokenizer(), o));
  o.max_seq_length = 10;
  o.doc_stride = 0;
  CHECK_FALSE(squad_convert_examples(eval_examples.examples, small_tokenizer(), o));
}

TEST_CASE("squad features: query truncated to max_query_length") {
  auto d = one_question("one two", "one two three four five", "two", 4);
  auto ex = squad_read_examples(d, squad_mode::evaluation);
  squad_feature_options o;
  o.max_query_length = 2;
  auto features = squad_convert_examples(ex.examples, small_tokenizer(), o);
  REQUIRE(features);
  const auto& t = (*features)[0].tokens;
  REQUIRE(t.size() == 7);
  CHECK(t[2] == "two");
  CHECK(t[3] == "[SEP]");
  CHECK(t[4] == "one");
}
