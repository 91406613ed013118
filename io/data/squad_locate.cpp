// Answer search in the context: exact at the offset, exact nearest, then up
// to case and whitespace nearest.
#include "io/data/squad_locate.hpp"

#include "io/data/squad_text.hpp"

#include <cstdlib>
#include <string>
#include <vector>

namespace dsa::data {
namespace {

// Text folded for the loose comparison, with the original index of every kept
// character (whitespace runs become one ' ' mapped to the run's first character).
struct folded_text {
  std::u32string text;
  std::vector<std::size_t> origin;
};

// Python's lower() of one character where it stays one character (it does for
// all but U+0130, which keeps its case here so that indices map one to one).
char32_t fold_char(char32_t c) {
  std::u32string lowered = python_lower(std::u32string_view(&c, 1));
  return lowered.size() == 1 ? lowered[0] : c;
}

folded_text fold(std::u32string_view text) {
  folded_text out;
  out.text.reserve(text.size());
  out.origin.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (python_is_space(text[i])) {
      if (!out.text.empty() && out.text.back() == U' ')
        continue;
      out.text.push_back(U' ');
    } else {
      out.text.push_back(fold_char(text[i]));
    }
    out.origin.push_back(i);
  }
  return out;
}

std::u32string strip_spaces(std::u32string text) {
  while (!text.empty() && text.back() == U' ')
    text.pop_back();
  std::size_t first = 0;
  while (first < text.size() && text[first] == U' ')
    ++first;
  return text.substr(first);
}

struct span {
  std::size_t begin = 0, end = 0; // code points of the context, [begin, end)
  bool found = false;
};

// Keeps `candidate` when it starts nearer `target` than `best` (earlier on ties,
// since candidates come in increasing order).
void keep_nearest(span& best, const span& candidate, std::int64_t target) {
  auto distance = [target](const span& s) {
    return std::llabs(static_cast<long long>(s.begin) - static_cast<long long>(target));
  };
  if (!best.found || distance(candidate) < distance(best))
    best = candidate;
}

span nearest_exact(std::u32string_view context, std::u32string_view answer, std::int64_t target) {
  span best;
  for (std::size_t at = context.find(answer); at != std::u32string_view::npos;
       at = context.find(answer, at + 1))
    keep_nearest(best, {at, at + answer.size(), true}, target);
  return best;
}

span nearest_folded(std::u32string_view context, std::u32string_view answer, std::int64_t target) {
  const folded_text haystack = fold(context);
  const std::u32string needle = strip_spaces(fold(answer).text);
  span best;
  if (needle.empty())
    return best;
  for (std::size_t at = haystack.text.find(needle); at != std::u32string::npos;
       at = haystack.text.find(needle, at + 1))
    keep_nearest(best, {haystack.origin[at], haystack.origin[at + needle.size() - 1] + 1, true},
                 target);
  return best;
}

} // namespace

squad_answer_place squad_locate_answer(std::u32string_view context, squad_answer& answer) {
  const std::u32string text = utf8_decode(answer.text);
  if (text.empty())
    return squad_answer_place::not_found;
  const std::int64_t start = answer.answer_start;
  if (start >= 0 && static_cast<std::size_t>(start) <= context.size() &&
      context.substr(static_cast<std::size_t>(start), text.size()) == text)
    return squad_answer_place::at_offset;
  span found = nearest_exact(context, text, start);
  if (!found.found)
    found = nearest_folded(context, text, start);
  if (!found.found)
    return squad_answer_place::not_found;
  answer.answer_start = static_cast<std::int64_t>(found.begin);
  answer.text = utf8_encode(context.substr(found.begin, found.end - found.begin));
  return squad_answer_place::moved;
}

} // namespace dsa::data
