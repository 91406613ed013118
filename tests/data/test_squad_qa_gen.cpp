// QA generated from a corpus: wh-word candidates, exact answer_start, the
// loader reads the output, determinism; trivial baselines.
#include "io/data/squad_baselines.hpp"
#include "io/data/squad_qa_gen.hpp"
#include "io/data/squad_text.hpp"

#include "tests/data/corpus_test_util.hpp"

#include <doctest/doctest.h>

using namespace dsa::data;

namespace {

std::vector<document> small_corpus() {
  std::vector<std::string> sentences = {
      "The meeting was held in Dallas on March 4, 1961.",
      "He bought 12 apples and Mr. John Smith paid for them.",
      "The committee praised the investigation of the election.",
      "Caf\xC3\xA9 owners in M\xC3\xBCnchen said the price rose in 1958.",
      "Later the Draft Act was passed by the Senate.",
      "Short one.",
      "Nothing here can be asked about at all, sadly.",
  };
  return dsa::test::rotated_documents(sentences, 12, 3, 1);
}

const qa_candidate* find_kind(const std::vector<qa_candidate>& cs, std::string_view sentence,
                              const char* kind, std::string_view answer) {
  for (const auto& c : cs)
    if (std::string_view(qa_kind_name(c.kind)) == kind &&
        sentence.substr(c.begin, c.end - c.begin) == answer)
      return &c;
  return nullptr;
}

} // namespace

TEST_CASE("qa candidates: places, dates, counts, names, content words") {
  std::string s = "The meeting was held in Dallas on March 4, 1961.";
  auto cs = qa_candidates(s);
  const qa_candidate* where = find_kind(cs, s, "where", "Dallas");
  REQUIRE(where);
  CHECK(qa_question(s, *where) == "The meeting was held where on March 4, 1961?");
  const qa_candidate* when = find_kind(cs, s, "when", "March 4, 1961");
  REQUIRE(when);
  CHECK(qa_question(s, *when) == "The meeting was held in Dallas when?");
  CHECK(find_kind(cs, s, "what", "meeting") ==
        nullptr); // sentence-initial "The" is not a name; "meeting" ends in -ing

  s = "He bought 12 apples and Mr. John Smith paid for them.";
  cs = qa_candidates(s);
  const qa_candidate* count = find_kind(cs, s, "how many", "12");
  REQUIRE(count);
  CHECK(qa_question(s, *count) == "He bought how many apples and Mr. John Smith paid for them?");
  const qa_candidate* who = find_kind(cs, s, "who", "Mr. John Smith");
  REQUIRE(who);
  CHECK(qa_question(s, *who) == "He bought 12 apples and who paid for them?");

  s = "In 1958 the committee praised the investigation.";
  cs = qa_candidates(s);
  const qa_candidate* year = find_kind(cs, s, "when", "1958");
  REQUIRE(year);
  CHECK(qa_question(s, *year) == "When the committee praised the investigation?");
  const qa_candidate* noun = find_kind(cs, s, "what", "committee");
  REQUIRE(noun);
  CHECK(qa_question(s, *noun) == "In 1958 what praised the investigation?");
  CHECK(qa_candidates("I'm sure it was fine and I'll go.").empty());
  // Clause-initial function words are capitalized but are not names.
  s = "-- The results were clear. (2) A patient left.";
  for (const auto& c : qa_candidates(s))
    CHECK(s.substr(c.begin, c.end - c.begin) != "The");
  for (const auto& c : qa_candidates(s))
    CHECK(s.substr(c.begin, c.end - c.begin) != "A");
}

TEST_CASE("qa-from-corpus: answers match, the loader reads the output, deterministic") {
  auto docs = small_corpus();
  qa_gen_options o;
  o.seed = 3;
  auto qa = generate_qa_from_corpus(docs, o);
  REQUIRE(qa);
  CHECK(qa->dev.articles.size() == 1); // 10% of 12 documents, rounded
  CHECK(qa->train.articles.size() == 11);
  std::int64_t total = qa->train.question_count() + qa->dev.question_count();
  CHECK(total == 12 * 3 * 2); // two questions per paragraph
  for (const auto* set : {&qa->train, &qa->dev}) {
    auto loaded = parse_squad(squad_to_json(*set), "generated.json");
    REQUIRE_MESSAGE(loaded, loaded.err().message);
    CHECK(loaded->question_count() == set->question_count());
    for (const auto& a : loaded->articles)
      for (const auto& p : a.paragraphs)
        for (const auto& q : p.qas) {
          const auto& ans = q.answers.at(0); // answer_start must hold the text, checked here
          std::u32string context = utf8_decode(p.context);
          CHECK(utf8_encode(context.substr(static_cast<std::size_t>(ans.answer_start),
                                           utf8_decode(ans.text).size())) == ans.text);
          CHECK(q.question.back() == '?');
          CHECK(q.question.find(ans.text) == std::string::npos);
        }
  }
  auto again = generate_qa_from_corpus(docs, o);
  REQUIRE(again);
  CHECK(squad_to_json(again->train) == squad_to_json(qa->train));
  CHECK(squad_to_json(again->dev) == squad_to_json(qa->dev));
  o.seed = 4;
  auto other = generate_qa_from_corpus(docs, o);
  REQUIRE(other);
  CHECK(squad_to_json(other->train) != squad_to_json(qa->train));
}

TEST_CASE("qa-from-corpus: code-point answer_start after non-ASCII text") {
  document doc;
  doc.id = "m";
  doc.paragraphs.push_back({{"Caf\xC3\xA9 owners in M\xC3\xBCnchen said the price rose in 1958."}});
  qa_gen_options o;
  o.dev_fraction = 0.0;
  o.questions_per_paragraph = 1;
  auto qa = generate_qa_from_corpus({doc}, o);
  REQUIRE(qa);
  REQUIRE(qa->train.question_count() == 1);
  const auto& a = qa->train.articles[0].paragraphs[0].qas[0].answers[0];
  CHECK(a.text == "1958"); // "in 1958" (priority 4) beats the place (3)
  CHECK(a.answer_start == 46);
  CHECK(a.byte_start == 48);
}

TEST_CASE("qa-from-corpus: limits and errors") {
  auto docs = small_corpus();
  qa_gen_options o;
  o.max_questions = 7;
  auto qa = generate_qa_from_corpus(docs, o);
  REQUIRE(qa);
  CHECK(qa->train.question_count() + qa->dev.question_count() == 7);
  o.dev_fraction = 1.0;
  CHECK_FALSE(generate_qa_from_corpus(docs, o));
  o.dev_fraction = 0.5;
  std::vector<document> one{docs[0]};
  qa = generate_qa_from_corpus(one, {});
  REQUIRE(qa);
  CHECK(qa->dev.question_count() > 0); // one document: dev gets some of its paragraphs
  CHECK(qa->train.question_count() > 0);
  document empty;
  empty.paragraphs.push_back({{"Short one."}});
  CHECK_FALSE(generate_qa_from_corpus({empty}, {}));
}

TEST_CASE("squad baselines: first sentence and random span") {
  CHECK(squad_first_sentence("It rained. Then it stopped.") == "It rained.");
  CHECK(squad_first_sentence("Mr.Smith left 3.5 days ago") == "Mr.Smith left 3.5 days ago");
  squad_dataset d;
  d.articles.resize(1);
  d.articles[0].paragraphs.push_back({"It rained. Then it stopped.", {}});
  d.articles[0].paragraphs[0].qas.push_back({"a", "?", {{"It rained.", 0, 0}}});
  d.articles[0].paragraphs[0].qas.push_back({"b", "?", {{"stopped", 19, 0}}});
  auto p = squad_baseline_predictions(d, squad_baseline::random_span, 9);
  REQUIRE(p.size() == 2);
  CHECK(p == squad_baseline_predictions(d, squad_baseline::random_span, 9));
  CHECK(std::string("It rained. Then it stopped.").find(p["a"]) != std::string::npos);
  auto scores = squad_evaluate_baselines(d, 9);
  REQUIRE(scores);
  CHECK(scores->first_sentence.exact_match == 50.0); // "a" exact, "b" no overlap
  CHECK(scores->first_sentence.f1 == 50.0);
}
