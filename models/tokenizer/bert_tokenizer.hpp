// BERT's tokenizer with HuggingFace semantics: BasicTokenizer (clean-up,
// CJK spacing, optional lower-casing and accent stripping, punctuation split)
// followed by greedy longest-match-first WordPiece with "##" continuations.
#pragma once

#include "core/error.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dsa::tok {

class vocab {
public:
  // Reads a standard vocab.txt (one token per line, id = line number).
  static expected<vocab> load(const std::string& path);
  static vocab from_tokens(std::vector<std::string> tokens);

  std::int32_t size() const { return static_cast<std::int32_t>(tokens_.size()); }
  bool contains(std::string_view token) const;
  // Id of a token, or the [UNK] id when absent.
  std::int32_t id(std::string_view token) const;
  const std::string& token(std::int32_t id) const;
  const std::vector<std::string>& tokens() const { return tokens_; }

  std::int32_t pad_id() const { return id("[PAD]"); }
  std::int32_t unk_id() const;
  std::int32_t cls_id() const { return id("[CLS]"); }
  std::int32_t sep_id() const { return id("[SEP]"); }
  std::int32_t mask_id() const { return id("[MASK]"); }

private:
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, std::int32_t> index_;
};

enum class casing : std::uint8_t { lower, keep }; // uncased (lower + strip accents) or cased

struct tokenizer_options {
  casing case_mode = casing::lower;
  bool strip_accents = true;     // HF: follows lower-casing unless set explicitly
  bool tokenize_chinese_chars = true;
  int max_input_chars_per_word = 100;
};

// Splits text into basic tokens (words and punctuation), UTF-8 in, UTF-8 out.
std::vector<std::string> basic_tokenize(std::string_view text, const tokenizer_options& options);

class bert_tokenizer {
public:
  bert_tokenizer(vocab v, tokenizer_options options = {});
  // WordPiece tokens ("##" continuations; "[UNK]" for unmatchable or over-long words).
  std::vector<std::string> tokenize(std::string_view text) const;
  std::vector<std::int32_t> encode(std::string_view text) const;
  // WordPiece of one basic token.
  std::vector<std::string> wordpiece(std::string_view word) const;
  const vocab& vocabulary() const { return vocab_; }
  const tokenizer_options& options() const { return options_; }

private:
  vocab vocab_;
  tokenizer_options options_;
};

} // namespace dsa::tok
