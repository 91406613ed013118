// BERT's BasicTokenizer with HuggingFace semantics: clean text, space out CJK
// ideographs, split on whitespace, lower-case and strip accents, split punctuation.
#include "models/tokenizer/bert_tokenizer.hpp"
#include "models/tokenizer/unicode.hpp"

namespace dsa::tok {
namespace {

// Drops NUL, U+FFFD and control characters; every whitespace character becomes
// ' '; CJK ideographs get a space on each side.
std::u32string clean(std::u32string_view text, bool space_cjk) {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t cp : text) {
    if (cp == 0 || cp == 0xFFFD || is_control(cp))
      continue;
    if (is_whitespace(cp)) {
      out.push_back(U' ');
    } else if (space_cjk && is_cjk_ideograph(cp)) {
      out.push_back(U' ');
      out.push_back(cp);
      out.push_back(U' ');
    } else {
      out.push_back(cp);
    }
  }
  return out;
}

std::u32string lower_and_strip(const std::u32string& word, bool lower, bool strip) {
  std::u32string lowered;
  if (lower) {
    for (char32_t cp : word)
      append_lower(lowered, cp);
  } else {
    lowered = word;
  }
  if (!strip)
    return lowered;
  std::u32string decomposed, out;
  for (char32_t cp : lowered)
    append_nfd(decomposed, cp);
  for (char32_t cp : decomposed)
    if (classify(cp) != char_class::nonspacing_mark)
      out.push_back(cp);
  return out;
}

// Every punctuation character becomes a token of its own.
void split_punctuation(std::vector<std::string>& out, const std::u32string& word) {
  std::string current;
  for (char32_t cp : word) {
    if (is_punctuation(cp)) {
      if (!current.empty())
        out.push_back(std::move(current));
      current.clear();
      std::string p;
      utf8_append(p, cp);
      out.push_back(std::move(p));
    } else {
      utf8_append(current, cp);
    }
  }
  if (!current.empty())
    out.push_back(std::move(current));
}

} // namespace

std::vector<std::string> basic_tokenize(std::string_view text, const tokenizer_options& options) {
  const bool lower = options.case_mode == casing::lower;
  // Accents are stripped only for uncased models, as HF does when strip_accents is unset.
  const bool strip = lower && options.strip_accents;
  std::u32string cleaned = clean(utf8_decode(text), options.tokenize_chinese_chars);
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < cleaned.size()) {
    while (i < cleaned.size() && cleaned[i] == U' ')
      ++i;
    std::size_t start = i;
    while (i < cleaned.size() && cleaned[i] != U' ')
      ++i;
    if (i > start)
      split_punctuation(out, lower_and_strip(cleaned.substr(start, i - start), lower, strip));
  }
  return out;
}

} // namespace dsa::tok
