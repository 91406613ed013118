// SQuAD v1.1 EM/F1 against hand-computed values, and the result line format.
#include "io/data/squad_eval.hpp"

#include <doctest/doctest.h>

using namespace dsa::data;

namespace {

squad_question question(std::string id, std::vector<std::string> answers) {
  squad_question q;
  q.id = std::move(id);
  q.question = "?";
  for (auto& a : answers)
    q.answers.push_back({std::move(a), 0, 0});
  return q;
}

} // namespace

TEST_CASE("squad normalize: lower-case, punctuation, articles, whitespace") {
  CHECK(squad_normalize_answer("The Cat!") == "cat");
  CHECK(squad_normalize_answer("  A  quick,\tbrown fox... ") == "quick brown fox");
  CHECK(squad_normalize_answer("an apple and the banana") == "apple and banana");
  CHECK(squad_normalize_answer("theatre anthem atheist") ==
        "theatre anthem atheist"); // whole words only
  CHECK(squad_normalize_answer("Levi's Stadium") == "levis stadium");
  CHECK(squad_normalize_answer("the-end") == "theend"); // punctuation goes before articles
  CHECK(squad_normalize_answer("a.b") == "ab");         // punctuation removal joins the letters
  CHECK(squad_normalize_answer("The") == "");
  CHECK(squad_normalize_answer("\xC3\x89"
                               "COLE  Normale") == "\xC3\xA9"
                                                   "cole normale"); // Unicode lower-casing
  CHECK(squad_normalize_answer("caf\xC3\xA9 a") == "caf\xC3\xA9");  // \b after a non-ASCII letter
  CHECK(squad_normalize_answer("\xC3\xA9"
                               "a b") == "\xC3\xA9"
                                         "a b");        // 'a' inside a word stays
  CHECK(squad_normalize_answer("x\xC2\xA0y") == "x y"); // NBSP is whitespace for str.split()
  CHECK(squad_normalize_answer("\xE2\x80\x9CQuoted\xE2\x80\x9D") ==
        "\xE2\x80\x9Cquoted\xE2\x80\x9D"); // not ASCII
}

TEST_CASE("squad exact match") {
  CHECK(squad_exact_match("The Cat!", "cat") == 1);
  CHECK(squad_exact_match("cats", "cat") == 0);
  CHECK(squad_exact_match("the", "a") == 1); // both normalize to ""
}

TEST_CASE("squad F1 by hand") {
  // pred {quick, brown, fox}, truth {quick, fox, jumps}: 2 shared, P = R = 2/3.
  CHECK(squad_f1("the quick brown fox", "quick fox jumps") ==
        doctest::Approx(2.0 / 3.0).epsilon(1e-15));
  // Counter intersection: "fox fox" vs "fox" shares one token: P = 1/2, R = 1, F1 = 2/3.
  CHECK(squad_f1("fox fox", "fox") == doctest::Approx(2.0 / 3.0).epsilon(1e-15));
  // 2 of 5 predicted tokens, 2 of 3 truth tokens: P = 0.4, R = 2/3, F1 = 0.5.
  CHECK(squad_f1("Levi's Stadium in Santa Clara", "Santa Clara, California") ==
        doctest::Approx(0.5));
  CHECK(squad_f1("red", "blue") == 0.0);
  CHECK(squad_f1("the", "a") == 0.0); // v1.1: empty token lists score F1 0 even though EM is 1
  CHECK(squad_f1("The Cat!", "cat") == 1.0);
}

TEST_CASE("squad evaluate: max over ground truths, unanswered scores 0") {
  squad_dataset d;
  d.version = "1.1";
  d.articles.resize(1);
  d.articles[0].paragraphs.resize(1);
  auto& qas = d.articles[0].paragraphs[0].qas;
  qas.push_back(question("q1", {"Denver Broncos", "The Denver Broncos"}));
  qas.push_back(question("q2", {"Santa Clara, California", "Levi's Stadium"}));
  qas.push_back(question("q3", {"February 7, 2016"}));
  squad_predictions p{
      {"q1", "denver broncos!"}, {"q2", "Levi's Stadium in Santa Clara"}, {"extra", "x"}};
  auto scores = squad_evaluate(d, p);
  REQUIRE(scores);
  CHECK(scores->total == 3);
  REQUIRE(scores->unanswered.size() == 1);
  CHECK(scores->unanswered[0] == "q3");
  // q1: EM 1, F1 1. q2: EM 0; F1 max(0.5, 2*0.4*1/1.4 = 0.5714285714285715). q3: 0.
  CHECK(scores->exact_match == 100.0 * 1 / 3);
  CHECK(python_float_repr(scores->exact_match) == "33.333333333333336");
  CHECK(python_float_repr(scores->f1) == "52.38095238095239");
  CHECK(squad_scores_json(*scores) ==
        R"({"exact_match": 33.333333333333336, "f1": 52.38095238095239})");
}

// Answers whose text differs from the context at answer_start: in case, in spacing, and
// at a wrong offset (also outside the context). The official script compares answer texts
// only. By its rules: "case" EM 1 F1 1; "space" ("santa clara california" against "santa
// clara") EM 0 F1 2pr/(p+r) with p = 2/3, r = 1: 0.8; "offset" ("panthers" against
// "carolina panthers", "carolina", "2410") EM 0 F1 max(2/3, 0, 0); "missing" unanswered, 0.
// EM = 100 * 1/4 = 25.0, F1 = 100 * (1 + 0.8 + 2/3) / 4 = 61.666..., the exact doubles
// the script prints.
TEST_CASE("squad evaluate: a dev file whose answers differ from the context scores as the official "
          "script") {
  const char* dev = R"({"version": "1.1", "data": [{"title": "Super_Bowl_50", "paragraphs": [
    {"context": "The Denver Broncos beat the Carolina Panthers 24-10 in Santa Clara, California.",
     "qas": [
      {"id": "case", "question": "Who won?", "answers": [{"text": "denver BRONCOS", "answer_start": 4}]},
      {"id": "space", "question": "Where?", "answers": [{"text": "Santa  Clara", "answer_start": 55}]},
      {"id": "offset", "question": "Who lost?", "answers": [{"text": "Carolina Panthers", "answer_start": 0},
        {"text": "Carolina", "answer_start": 999}, {"text": "24-10", "answer_start": -3}]},
      {"id": "missing", "question": "Score?", "answers": [{"text": "24-10", "answer_start": 46}]}]}]}]})";
  auto dataset = parse_squad(dev, "dev.json");
  REQUIRE_MESSAGE(dataset, dataset.err().message);
  auto predictions = parse_squad_predictions(
      R"({"case": "Denver Broncos", "space": "Santa Clara, California", "offset": "the Panthers",
          "extra": "ignored"})",
      "predictions.json");
  REQUIRE(predictions);
  auto scores = squad_evaluate(*dataset, *predictions);
  REQUIRE(scores);
  CHECK(scores->total == 4);
  CHECK(scores->unanswered == std::vector<std::string>{"missing"});
  CHECK(squad_scores_json(*scores) == R"({"exact_match": 25.0, "f1": 61.66666666666667})");
  CHECK(scores->f1 == 100.0 * (1.0 + (2 * (2.0 / 3.0)) / (2.0 / 3.0 + 1.0) + (2 * 0.5) / 1.5) / 4);
}

// The official script reads only ids and answer texts: a file without titles, contexts,
// questions or answer_start (or with other types there), with an id twice, is scored: "a"
// twice ("blue whales" against "blue whale": F1 0.5 each), "b" EM 1 against "Everest".
// EM = 100 * 1/3, F1 = 100 * (0.5 + 0.5 + 1) / 3, as the script prints them.
TEST_CASE("squad evaluate: the scorer reads only what evaluate-v1.1 reads") {
  const char* dev = R"({"version": "1.1", "data": [{"paragraphs": [
    {"context": 7, "qas": [
      {"id": "a", "answers": [{"text": "Blue whale"}]},
      {"id": "a", "answers": [{"text": "the blue whale", "answer_start": "x"}]}]},
    {"qas": [{"id": "b", "answers": [{"text": "Mount Everest"}, {"text": "Everest"}]}]}]}]})";
  auto dataset = parse_squad(dev, "dev.json", squad_fields::scored);
  REQUIRE_MESSAGE(dataset, dataset.err().message);
  auto predictions =
      parse_squad_predictions(R"({"a": "blue whales", "b": "Everest"})", "predictions.json");
  REQUIRE(predictions);
  auto scores = squad_evaluate(*dataset, *predictions);
  REQUIRE(scores);
  CHECK(scores->total == 3);
  CHECK(squad_scores_json(*scores) ==
        R"({"exact_match": 33.333333333333336, "f1": 66.66666666666667})");
  // What the script needs is still required; training and the run's evaluation need the rest.
  auto no_text =
      parse_squad(R"({"data": [{"paragraphs": [{"qas": [{"id": "a", "answers": [{}]}]}]}]})",
                  "dev.json", squad_fields::scored);
  REQUIRE_FALSE(no_text);
  CHECK(no_text.err().message.find("'text'") != std::string::npos);
  auto full = parse_squad(dev, "dev.json");
  REQUIRE_FALSE(full);
  CHECK(full.err().message.find("'title'") != std::string::npos);
}

TEST_CASE("squad evaluate: a question without answers counts only when unanswered, as in evaluate-v1.1") {
  const char* dev = R"({"data": [{"paragraphs": [{"qas": [
    {"id": "a", "answers": [{"text": "Everest"}]}, {"id": "b", "answers": []}]}]}]})";
  auto dataset = parse_squad(dev, "dev.json", squad_fields::scored);
  REQUIRE_MESSAGE(dataset, dataset.err().message);
  // Unanswered: it scores 0 and counts in the total.
  auto scores = squad_evaluate(*dataset, *parse_squad_predictions(R"({"a": "Everest"})", "p.json"));
  REQUIRE(scores);
  CHECK(scores->total == 2);
  CHECK(squad_scores_json(*scores) == R"({"exact_match": 50.0, "f1": 50.0})");
  // Answered: there is nothing to score it against (the script fails on it too).
  auto refused = squad_evaluate(*dataset, *parse_squad_predictions(R"({"a": "Everest", "b": "x"})", "p.json"));
  REQUIRE_FALSE(refused);
  CHECK(refused.err().message.find("question 'b'") != std::string::npos);
}

TEST_CASE("squad evaluate: empty data set is an error") {
  squad_dataset d;
  auto scores = squad_evaluate(d, {});
  REQUIRE_FALSE(scores);
  CHECK(scores.err().code == dsa::errc::invalid_argument);
}

TEST_CASE("python float repr") {
  CHECK(python_float_repr(81.2) == "81.2");
  CHECK(python_float_repr(80.12345678901234) == "80.12345678901234");
  CHECK(python_float_repr(100.0) == "100.0");
  CHECK(python_float_repr(0.0) == "0.0");
  CHECK(python_float_repr(0.1 + 0.2) == "0.30000000000000004");
  CHECK(python_float_repr(1e-05) == "1e-05");
  CHECK(python_float_repr(1e16) == "1e+16");
  CHECK(python_float_repr(123456789012345678.0) == "1.2345678901234568e+17");
  squad_scores s;
  s.exact_match = 100.0;
  s.f1 = 81.2;
  CHECK(squad_scores_json(s) == R"({"exact_match": 100.0, "f1": 81.2})");
}

TEST_CASE("squad predictions file") {
  auto p = parse_squad_predictions(R"({"a": "x", "b": ""})", "p.json");
  REQUIRE(p);
  CHECK(p->at("a") == "x");
  CHECK(p->at("b").empty());
  auto bad = parse_squad_predictions(R"({"a": 3})", "p.json");
  REQUIRE_FALSE(bad);
  CHECK(bad.err().message.find("'a'") != std::string::npos);
  CHECK_FALSE(parse_squad_predictions("[1]", "p.json"));
  CHECK_FALSE(parse_squad_predictions("{", "p.json"));
}
