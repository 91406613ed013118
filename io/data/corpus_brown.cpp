// Brown corpus reader: tagged tokens back to plain sentences, paragraphs and documents.
#include "io/data/corpus_brown.hpp"

#include <cctype>

namespace dsa::data {
namespace {

std::vector<std::string_view> split_spaces(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i])))
      ++i;
    std::size_t start = i;
    while (i < line.size() && !std::isspace(static_cast<unsigned char>(line[i])))
      ++i;
    if (i > start)
      out.push_back(line.substr(start, i - start));
  }
  return out;
}

struct tagged {
  std::string_view word;
  std::string_view tag;
};

tagged split_tag(std::string_view token) {
  auto slash = token.rfind('/');
  if (slash == std::string_view::npos || slash == 0)
    return {token, {}};
  return {token.substr(0, slash), token.substr(slash + 1)};
}

bool is_headline(const std::vector<std::string_view>& tokens) {
  if (tokens.empty())
    return false;
  for (auto t : tokens)
    if (split_tag(t).tag.find("-hl") == std::string_view::npos)
      return false;
  return true;
}

bool one_of(std::string_view word, std::initializer_list<const char*> set) {
  for (const char* s : set)
    if (word == s)
      return true;
  return false;
}

} // namespace

bool is_brown_file_name(std::string_view name) {
  return name.size() == 4 && name[0] == 'c' && name[1] >= 'a' && name[1] <= 'r' &&
         std::isdigit(static_cast<unsigned char>(name[2])) &&
         std::isdigit(static_cast<unsigned char>(name[3]));
}

std::string brown_detokenize(std::string_view tagged_line) {
  std::vector<std::string_view> words;
  for (auto t : split_spaces(tagged_line))
    words.push_back(split_tag(t).word);
  if (words.size() >= 2 && words.back() == words[words.size() - 2] &&
      one_of(words.back(), {";", "?", "!", ":"}))
    words.pop_back();
  // "Jr./np ./." ends with one period; the corpus moved . , ? ! after a closing
  // double quote, American usage puts them inside.
  std::vector<std::string_view> fixed;
  for (std::size_t i = 0; i < words.size(); ++i) {
    if (words[i] == "." && !fixed.empty() && fixed.back().size() > 1 && fixed.back().back() == '.')
      continue;
    if (words[i] == "''" && i + 1 < words.size() && one_of(words[i + 1], {".", ",", "?", "!"})) {
      fixed.push_back(words[i + 1]);
      fixed.push_back(words[i]);
      ++i;
      continue;
    }
    fixed.push_back(words[i]);
  }
  words = std::move(fixed);

  std::string out;
  bool glue_next = true; // no space before the first word
  int single_quotes = 0;
  for (auto w : words) {
    std::string text(w);
    bool opens = false, closes = false;
    if (w == "``") {
      text = "\"";
      opens = true;
    } else if (w == "''") {
      text = "\"";
      closes = true;
    } else if (w == "'") {
      opens = single_quotes++ % 2 == 0;
      closes = !opens;
    } else if (w == "`") {
      text = "'";
      opens = true;
    } else if (one_of(w, {".", ",", ";", ":", "?", "!", ")", "]", "}"})) {
      closes = true;
    } else if (one_of(w, {"(", "[", "{"})) {
      opens = true;
    }
    if (!glue_next && !closes)
      out.push_back(' ');
    out += text;
    glue_next = opens;
  }
  return out;
}

document parse_brown_document(std::string_view text, const std::string& id) {
  document doc;
  doc.id = id;
  paragraph current;
  auto flush = [&] {
    if (!current.sentences.empty())
      doc.paragraphs.push_back(std::move(current));
    current = paragraph{};
  };
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos)
      eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    auto tokens = split_spaces(line);
    if (tokens.empty()) {
      flush();
    } else if (is_headline(tokens)) {
      flush();
      current.sentences.push_back(brown_detokenize(line));
      flush();
    } else {
      std::string sentence = brown_detokenize(line);
      if (!sentence.empty())
        current.sentences.push_back(std::move(sentence));
    }
    if (eol == text.size())
      break;
  }
  flush();
  return doc;
}

} // namespace dsa::data
