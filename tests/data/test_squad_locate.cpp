// Finding a training answer in its context when answer_start is off or the text
// differs in case or spacing: which occurrence wins, and what the answer becomes.
#include "io/data/squad_locate.hpp"
#include "io/data/squad_text.hpp"

#include <doctest/doctest.h>

using namespace dsa::data;

namespace {

struct located {
  squad_answer_place place;
  squad_answer answer;
};

located locate(const std::string& context, const std::string& text, std::int64_t start) {
  squad_answer a{text, start, 0};
  squad_answer_place place = squad_locate_answer(utf8_decode(context), a);
  return {place, a};
}

} // namespace

TEST_CASE("squad locate: an answer at its offset is left alone") {
  auto r = locate("to be or  not to be", "to be", 14);
  CHECK(r.place == squad_answer_place::at_offset);
  CHECK(r.answer.answer_start == 14);
  CHECK(r.answer.text == "to be");
}

TEST_CASE("squad locate: a wrong offset moves to the nearest exact occurrence") {
  // "to be" at 0 and 14: 9 is nearer 14, 6 nearer 0, and 7 ties and goes to the earlier.
  const std::string context = "to be or  not to be";
  CHECK(locate(context, "to be", 9).answer.answer_start == 14);
  CHECK(locate(context, "to be", 6).answer.answer_start == 0);
  auto tie = locate(context, "to be", 7);
  CHECK(tie.place == squad_answer_place::moved);
  CHECK(tie.answer.answer_start == 0);
  // Offsets past either end of the context.
  CHECK(locate(context, "to be", -4).answer.answer_start == 0);
  CHECK(locate(context, "to be", 400).answer.answer_start == 14);
  // An exact occurrence wins over a nearer one that differs in case.
  auto exact = locate("To be or  not to be", "to be", 0);
  CHECK(exact.place == squad_answer_place::moved);
  CHECK(exact.answer.answer_start == 14);
}

TEST_CASE("squad locate: up to case and whitespace, with the context's own characters") {
  // Offsets count code points: "Caf\u00e9 " is 5 of them, 6 bytes.
  const std::string context = "Caf\xC3\xA9 \xC3\x89"
                              "COLE  Normale\n sup\xC3\xA9rieure, Paris";
  auto r = locate(context,
                  " \xC3\xA9"
                  "cole normale SUP\xC3\x89RIEURE ",
                  3);
  CHECK(r.place == squad_answer_place::moved);
  CHECK(r.answer.answer_start == 5);
  CHECK(r.answer.text == "\xC3\x89"
                         "COLE  Normale\n sup\xC3\xA9rieure");
  // Whitespace inside a word is not ignored, and a missing answer stays as it was.
  auto missing = locate(context, "Nor male", 11);
  CHECK(missing.place == squad_answer_place::not_found);
  CHECK(missing.answer.answer_start == 11);
  CHECK(missing.answer.text == "Nor male");
  CHECK(locate(context, "", 0).place == squad_answer_place::not_found);
  CHECK(locate(context, " \n ", 0).place == squad_answer_place::not_found);
}
