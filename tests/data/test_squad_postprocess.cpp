// SQuAD post-processing: best valid span over windows, final-text recovery,
// predictions.json.
#include "io/data/squad_postprocess.hpp"

#include "io/data/squad_eval.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <unistd.h>

using namespace dsa::data;
using dsa::tok::bert_tokenizer;
using dsa::tok::vocab;

namespace {

bert_tokenizer small_tokenizer() {
  return bert_tokenizer(vocab::from_tokens(
      {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "q",     "super",  "bowl", "50",
       "was",   "won",   "by",    "the",   "denver", "bro",   "##ncos", ",",    "in",
       "2016",  ".",     "one",   "two",   "three",  "four",  "five",   "six",  "seven",
       "eight", "##een", "nine",  "ten",   "eleven", "twelve"}));
}

squad_dataset one_paragraph(const std::string& context, std::vector<std::string> ids) {
  squad_dataset d;
  d.articles.resize(1);
  d.articles[0].paragraphs.resize(1);
  d.articles[0].paragraphs[0].context = context;
  for (auto& id : ids)
    d.articles[0].paragraphs[0].qas.push_back({id, "q", {{"x", 0, 0}}});
  return d;
}

// Logits of `n` positions: -100 everywhere except the given (position, value) pairs.
std::vector<float> logits(std::size_t n, std::initializer_list<std::pair<int, float>> peaks) {
  std::vector<float> out(n, -100.0f);
  for (auto [i, v] : peaks)
    out[static_cast<std::size_t>(i)] = v;
  return out;
}

} // namespace

TEST_CASE("squad get_final_text recovers casing and trims to the predicted characters") {
  dsa::tok::tokenizer_options lower;
  CHECK(squad_get_final_text("denver broncos", "Denver Broncos,", lower) == "Denver Broncos");
  CHECK(squad_get_final_text("steve smith", "Steve Smith's", lower) == "Steve Smith");
  CHECK(squad_get_final_text("1895", "(1895-1943).", lower) == "1895");
  CHECK(squad_get_final_text("cafe", "Caf\xC3\xA9,", lower) ==
        "Caf\xC3\xA9"); // accent stripped, same length
  CHECK(squad_get_final_text("nowhere", "Denver Broncos", lower) == "Denver Broncos"); // fallback
  dsa::tok::tokenizer_options cased;
  cased.case_mode = dsa::tok::casing::keep;
  cased.strip_accents = false;
  CHECK(squad_get_final_text("Broncos", "Denver Broncos,", cased) == "Broncos");
}

TEST_CASE("squad post-processing picks the best valid span and recovers the original text") {
  // Words: Super Bowl 50 was won by the Denver Broncos, in 2016.  (tabs and double spaces collapse)
  auto d = one_paragraph("Super Bowl 50 was won by  the Denver\tBroncos, in 2016.", {"a"});
  auto ex = squad_read_examples(d, squad_mode::evaluation).examples;
  squad_feature_options fo;
  fo.max_seq_length = 24;
  auto features = squad_convert_examples(ex, small_tokenizer(), fo);
  REQUIRE(features);
  REQUIRE(features->size() == 1);
  const auto& f = (*features)[0];
  // [CLS] q [SEP] super bowl 50 was won by the denver bro ##ncos , in 2016 . [SEP]
  REQUIRE(f.tokens.size() == 18);
  REQUIRE(f.tokens[10] == "denver");
  REQUIRE(f.tokens[12] == "##ncos");
  squad_raw_result r;
  r.unique_id = f.unique_id;
  // Start: the query token and padding (invalid) beat "denver"; end: [CLS] and padding (invalid)
  // and "won" (end before start) beat "##ncos" (5), then "," (4) and "bro" (3).
  r.start_logits = logits(24, {{1, 9.0f}, {10, 6.0f}, {9, 2.0f}, {20, 8.0f}});
  r.end_logits = logits(24, {{0, 9.0f}, {21, 9.5f}, {12, 5.0f}, {13, 4.0f}, {11, 3.0f}, {5, 7.0f}});
  squad_postprocess_options po;
  auto p = squad_postprocess(ex, *features, {r}, po);
  REQUIRE(p);
  REQUIRE(p->size() == 1);
  const auto& pred = (*p)[0];
  CHECK(pred.qas_id == "a");
  // start 10 ("denver") with end 5 is end < start; best valid is (10, 12) = "denver broncos".
  CHECK(pred.text == "Denver Broncos");
  REQUIRE(pred.nbest.size() >= 2);
  CHECK(pred.nbest[0].start_logit == 6.0);
  CHECK(pred.nbest[0].end_logit == 5.0);
  CHECK(pred.nbest[1].text == "Denver Broncos,"); // (10, 13)
  double total = 0.0;
  for (const auto& n : pred.nbest)
    total += n.probability;
  CHECK(total == doctest::Approx(1.0));

  po.max_answer_length =
      2; // spans of 3+ tokens are too long: (10, 11) "denver bro" is the best left
  p = squad_postprocess(ex, *features, {r}, po);
  REQUIRE(p);
  CHECK((*p)[0].text == "Denver Bro");

  // No valid span at all: the reference answers "empty".
  r.start_logits = logits(24, {{1, 9.0f}});
  r.end_logits = logits(24, {{0, 9.0f}});
  po.n_best_size = 1;
  p = squad_postprocess(ex, *features, {r}, po);
  REQUIRE(p);
  CHECK((*p)[0].text == "empty");

  // A feature without a result is an error naming it.
  auto missing = squad_postprocess(ex, *features, {}, po);
  REQUIRE_FALSE(missing);
  CHECK(missing.err().message.find("'a'") != std::string::npos);
}

TEST_CASE("squad post-processing over windows: start must be in its max-context window") {
  auto d =
      one_paragraph("one two three four five six seven eighteen nine ten eleven twelve", {"w"});
  auto ex = squad_read_examples(d, squad_mode::evaluation).examples;
  squad_feature_options fo;
  fo.max_seq_length = 10;
  fo.doc_stride = 3;
  auto features = squad_convert_examples(ex, small_tokenizer(), fo);
  REQUIRE(features);
  REQUIRE(features->size() == 4); // windows [0..5], [3..8], [6..11], [9..12] after [CLS] q [SEP]
  std::vector<squad_raw_result> results;
  for (const auto& f : *features)
    results.push_back({f.unique_id, logits(10, {}), logits(10, {})});
  // Window 0: "six" (sub-token 5, position 8) scores highest, but its max context is window 1.
  results[0].start_logits[8] = 9.0f;
  results[0].end_logits[8] = 9.0f;
  // Window 1: "six seven" (positions 5..6) is valid.
  results[1].start_logits[5] = 3.0f;
  results[1].end_logits[6] = 3.0f;
  // Window 2: "seven eighteen" (positions 3..5), start "seven" (sub-token 6) has max context in
  // window 1: invalid.
  results[2].start_logits[3] = 8.0f;
  results[2].end_logits[5] = 8.0f;
  auto p = squad_postprocess(ex, *features, results, {});
  REQUIRE(p);
  CHECK((*p)[0].text == "six seven");
}

TEST_CASE("squad predictions.json is written atomically and reads back") {
  std::vector<squad_prediction> preds(2);
  preds[0].qas_id = "b";
  preds[0].text = "D\xC3\xBCsseldorf";
  preds[1].qas_id = "a";
  preds[1].text = "x";
  std::string text = squad_predictions_json(preds);
  CHECK(text.find("\"b\": \"D\\u00fcsseldorf\"") <
        text.find("\"a\"")); // example order, ASCII escapes
  char dir[] = "/tmp/squad_pp_XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  std::string path = std::string(dir) + "/predictions.json";
  REQUIRE(write_squad_predictions(path, preds));
  auto back = load_squad_predictions(path);
  REQUIRE(back);
  CHECK(back->at("b") == "D\xC3\xBCsseldorf");
  CHECK(back->at("a") == "x");
  std::remove(path.c_str());
  rmdir(dir);
}
