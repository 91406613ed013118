// SQuAD v1.1 loader: real layout reads, every malformed case names its place.
#include "io/data/squad_dataset.hpp"
#include "io/data/squad_text.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace dsa::data;

namespace {

// One article "Broncos" with two paragraphs; the second holds question q2.
std::string file_with(const std::string& second_question) {
  return R"({"version": "1.1", "data": [
    {"title": "Other", "paragraphs": []},
    {"title": "Broncos", "paragraphs": [
      {"context": "The Denver Broncos won.", "qas": [
        {"id": "q1", "question": "Who won?", "answers": [{"text": "Denver Broncos", "answer_start": 4}]}]},
      {"context": "Caf\u00e9 \ud83d\ude00 in D\u00fcsseldorf opened in 1999.", "qas": [)" +
         second_question + "]}]}]}";
}

const std::string good_q2 =
    R"({"id": "q2", "question": "Where?", "answers": [{"text": "D\u00fcsseldorf", "answer_start": 10},
       {"text": "1999", "answer_start": 31}]})";

std::string load_error(const std::string& q2) {
  auto d = parse_squad(file_with(q2), "dev.json");
  REQUIRE_FALSE(d);
  CHECK(d.err().code == dsa::errc::format);
  return d.err().message;
}

bool names_all(const std::string& message, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    if (message.find(p) == std::string::npos)
      return false;
  return true;
}

} // namespace

TEST_CASE("squad loader reads the official layout with code-point offsets") {
  auto d = parse_squad(file_with(good_q2), "dev.json");
  REQUIRE(d);
  CHECK(d->version == "1.1");
  REQUIRE(d->articles.size() == 2);
  CHECK(d->question_count() == 2);
  const auto& p = d->articles[1].paragraphs[1];
  REQUIRE(p.qas.size() == 1);
  CHECK(p.qas[0].id == "q2");
  const auto& a = p.qas[0].answers;
  REQUIRE(a.size() == 2);
  // "Café " is 5 characters, 6 bytes; the emoji 1 character, 4 bytes; " in " 4: 10 characters, 14
  // bytes.
  CHECK(a[0].answer_start == 10);
  auto offsets = utf8_code_point_offsets(p.context);
  squad_answer first = a[0], second = a[1];
  REQUIRE(squad_answer_matches(p.context, offsets, first));
  CHECK(first.byte_start == 14);
  REQUIRE(squad_answer_matches(p.context, offsets, second));
  CHECK(p.context.substr(second.byte_start, 4) == "1999");
}

TEST_CASE("squad loader round-trips through its writer") {
  auto d = parse_squad(file_with(good_q2), "dev.json");
  REQUIRE(d);
  auto again = parse_squad(squad_to_json(*d), "again.json");
  REQUIRE(again);
  CHECK(squad_to_json(*again) == squad_to_json(*d));
  CHECK(squad_to_json(*d).find("\\u00fc") !=
        std::string::npos); // ensure_ascii, as Python's json.dump
}

TEST_CASE("squad loader: missing field names article, paragraph and question") {
  std::string m = load_error(R"({"id": "q2", "question": "Where?"})");
  CHECK(names_all(m, {"dev.json", "article 1", "Broncos", "paragraph 1", "'q2'", "'answers'"}));
  m = load_error(R"({"id": "q2", "question": "Where?", "answers": [{"answer_start": 10}]})");
  CHECK(names_all(m, {"article 1", "paragraph 1", "'q2'", "answers[0]", "'text'"}));
  m = load_error(R"({"question": "Where?", "answers": []})");
  CHECK(names_all(m, {"article 1", "paragraph 1", "'id'"}));
  auto d = parse_squad(R"({"data": [{"paragraphs": []}]})", "x.json");
  REQUIRE_FALSE(d);
  CHECK(names_all(d.err().message, {"article 0", "'title'"}));
  d = parse_squad(R"({"data": [{"title": "T", "paragraphs": [{"qas": []}]}]})", "x.json");
  REQUIRE_FALSE(d);
  CHECK(names_all(d.err().message, {"article 0", "'T'", "paragraph 0", "'context'"}));
  d = parse_squad(R"({"version": "1.1"})", "x.json");
  REQUIRE_FALSE(d);
  CHECK(names_all(d.err().message, {"x.json", "'data'"}));
}

TEST_CASE("squad loader: wrong types name the place") {
  std::string m = load_error(R"({"id": 7, "question": "Where?", "answers": []})");
  CHECK(names_all(m, {"article 1", "paragraph 1", "'id'", "integer", "string"}));
  m = load_error(
      R"({"id": "q2", "question": "Where?", "answers": [{"text": "1999", "answer_start": "31"}]})");
  CHECK(names_all(m, {"article 1", "paragraph 1", "'q2'", "'answer_start'", "string", "integer"}));
  m = load_error(
      R"({"id": "q2", "question": "Where?", "answers": [{"text": "1999", "answer_start": 31.0}]})");
  CHECK(names_all(m, {"'q2'", "'answer_start'", "float"}));
  m = load_error(R"({"id": "q2", "question": ["Where?"], "answers": []})");
  CHECK(names_all(m, {"'q2'", "'question'", "array"}));
  m = load_error(R"({"id": "q2", "question": "Where?", "answers": {"text": "1999"}})");
  CHECK(names_all(m, {"'q2'", "'answers'", "object", "array"}));
  auto d = parse_squad(R"({"data": [{"title": "T", "paragraphs": [{"context": 1, "qas": []}]}]})",
                       "x.json");
  REQUIRE_FALSE(d);
  CHECK(names_all(d.err().message, {"article 0", "paragraph 0", "'context'"}));
  d = parse_squad(R"({"version": 1.1, "data": []})", "x.json");
  REQUIRE_FALSE(d);
  CHECK(names_all(d.err().message, {"'version'"}));
  CHECK_FALSE(parse_squad("[]", "x.json"));
  CHECK_FALSE(parse_squad("{\"data\": [", "x.json"));
}

TEST_CASE("squad loader keeps answers that differ from the context at answer_start") {
  // 14 is the byte offset (15 characters in is "ldorf ope"); 33 and -1 lie outside the context;
  // "caf\u00e9" differs in case. The official script never reads answer_start or the context.
  auto d = parse_squad(
      file_with(
          R"({"id": "q2", "question": "Where?", "answers": [{"text": "D\u00fcsseldorf", "answer_start": 15},
             {"text": "1999", "answer_start": 33}, {"text": "1999", "answer_start": -1},
             {"text": "caf\u00e9", "answer_start": 0}]})"),
      "dev.json");
  REQUIRE_MESSAGE(d, d.err().message);
  const auto& p = d->articles[1].paragraphs[1];
  const auto& a = p.qas.at(0).answers;
  REQUIRE(a.size() == 4);
  CHECK(a[0].text == "D\xC3\xBCsseldorf");
  CHECK(a[0].answer_start == 15);
  CHECK(a[1].answer_start == 33);
  CHECK(a[2].answer_start == -1);
  CHECK(a[3].text == "caf\xC3\xA9");
  auto offsets = utf8_code_point_offsets(p.context);
  for (const auto& answer : a) {
    squad_answer copy = answer;
    CHECK_FALSE(squad_answer_matches(p.context, offsets, copy));
  }
}

TEST_CASE("squad loader: empty answers and duplicate ids") {
  std::string m = load_error(R"({"id": "q2", "question": "Where?", "answers": []})");
  CHECK(names_all(m, {"'q2'", "no answers"}));
  m = load_error(
      R"({"id": "q1", "question": "Where?", "answers": [{"text": "1999", "answer_start": 31}]})");
  CHECK(names_all(m, {"'q1'", "duplicate"}));
}

TEST_CASE("squad loader: missing file") {
  auto d = load_squad("/nonexistent/dev.json");
  REQUIRE_FALSE(d);
  CHECK(d.err().message.find("/nonexistent/dev.json") != std::string::npos);
}
