// vocab: a WordPiece vocabulary (vocab.txt: one token per line, id = line number).
#include "models/tokenizer/bert_tokenizer.hpp"

#include <fstream>

namespace dsa::tok {

expected<vocab> vocab::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return make_error(errc::not_found, "cannot open vocabulary '{}'", path);
  std::vector<std::string> tokens;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    tokens.push_back(std::move(line));
  }
  if (in.bad())
    return make_error(errc::io, "read error in vocabulary '{}'", path);
  if (tokens.empty())
    return make_error(errc::format, "vocabulary '{}' is empty", path);
  vocab v = from_tokens(std::move(tokens));
  if (!v.contains("[UNK]"))
    return make_error(errc::format, "vocabulary '{}' has no [UNK] token", path);
  return v;
}

vocab vocab::from_tokens(std::vector<std::string> tokens) {
  vocab v;
  v.tokens_ = std::move(tokens);
  v.index_.reserve(v.tokens_.size());
  // As HuggingFace's load_vocab: a repeated token maps to its last line.
  for (std::size_t i = 0; i < v.tokens_.size(); ++i)
    v.index_[v.tokens_[i]] = static_cast<std::int32_t>(i);
  return v;
}

bool vocab::contains(std::string_view token) const {
  return index_.count(std::string(token)) > 0;
}

std::int32_t vocab::id(std::string_view token) const {
  auto it = index_.find(std::string(token));
  return it != index_.end() ? it->second : unk_id();
}

std::int32_t vocab::unk_id() const {
  auto it = index_.find("[UNK]");
  DSA_CHECK(it != index_.end(), "vocabulary of {} tokens has no [UNK]", tokens_.size());
  return it->second;
}

const std::string& vocab::token(std::int32_t id) const {
  DSA_CHECK(id >= 0 && id < size(), "token id {} outside vocabulary of {}", id, size());
  return tokens_[static_cast<std::size_t>(id)];
}

} // namespace dsa::tok
