// bert_tokenizer: BasicTokenizer then greedy longest-match-first WordPiece.
#include "models/tokenizer/bert_tokenizer.hpp"
#include "models/tokenizer/unicode.hpp"

namespace dsa::tok {

bert_tokenizer::bert_tokenizer(vocab v, tokenizer_options options)
    : vocab_(std::move(v)), options_(options) {}

std::vector<std::string> bert_tokenizer::wordpiece(std::string_view word) const {
  // Byte offset of every code point boundary; the limit counts code points.
  std::vector<std::size_t> bounds;
  std::u32string cps = utf8_decode(word);
  std::string canonical = utf8_encode(cps);
  std::size_t offset = 0;
  for (char32_t cp : cps) {
    bounds.push_back(offset);
    offset += cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
  }
  bounds.push_back(offset);
  const std::size_t n = cps.size();
  if (n == 0)
    return {};
  if (n > static_cast<std::size_t>(options_.max_input_chars_per_word))
    return {"[UNK]"};

  std::vector<std::string> pieces;
  std::size_t start = 0;
  std::string candidate;
  while (start < n) {
    std::size_t end = n;
    bool found = false;
    while (start < end) {
      candidate.assign(start > 0 ? "##" : "");
      candidate.append(canonical, bounds[start], bounds[end] - bounds[start]);
      if (vocab_.contains(candidate)) {
        found = true;
        break;
      }
      --end;
    }
    if (!found)
      return {"[UNK]"};
    pieces.push_back(candidate);
    start = end;
  }
  return pieces;
}

std::vector<std::string> bert_tokenizer::tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (const auto& word : basic_tokenize(text, options_))
    for (auto& piece : wordpiece(word))
      out.push_back(std::move(piece));
  return out;
}

std::vector<std::int32_t> bert_tokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> ids;
  for (const auto& piece : tokenize(text))
    ids.push_back(vocab_.id(piece));
  return ids;
}

} // namespace dsa::tok
