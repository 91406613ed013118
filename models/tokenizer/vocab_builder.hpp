// Trains a WordPiece vocabulary from word counts, BERT vocab.txt layout:
//   [PAD], [unused0] .. [unusedK-1], [UNK], [CLS], [SEP], [MASK],
//   single characters (word-initial forms, then "##" continuation forms, each by code point),
//   then learned pieces in the order they were learned.
//
// Algorithm (a byte-pair-encoding merge learner over WordPiece symbols, as the
// HuggingFace WordPiece trainer does): every word starts as its characters, the
// first plain and the rest "##"-prefixed. Repeatedly the adjacent symbol pair
// with the highest count (count of a pair = sum of the counts of the words it
// occurs in, per occurrence) is merged into one symbol ("un" + "##aff" ->
// "unaff", "##a" + "##b" -> "##ab"); each new symbol joins the vocabulary.
// Ties go to the lexicographically smallest (left, right) pair by bytes, so the
// result is deterministic. Learning stops when the vocabulary reaches `size`
// or no pair occurs `min_pair_count` times; the vocabulary is never larger than `size`.
// When the characters alone exceed the budget, the most frequent are kept and
// words with a dropped character take no part in merging.
#pragma once

#include "models/tokenizer/bert_tokenizer.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace dsa::tok {

struct vocab_build_options {
  int size = 30522;       // total vocabulary size, special tokens included
  int unused_tokens = 10; // [unused0] .. [unusedK-1]
  std::int64_t min_pair_count = 2;
  // Called every `progress_every` merges with (merges so far, vocabulary size so far).
  std::function<void(std::int64_t, std::int64_t)> progress;
  std::int64_t progress_every = 1000;
};

// Counts the basic tokens (words and punctuation) of text, as the tokenizer splits them.
class word_counter {
public:
  explicit word_counter(tokenizer_options options) : options_(options) {}
  void add_text(std::string_view text);
  const std::map<std::string, std::int64_t>& counts() const { return counts_; }

private:
  tokenizer_options options_;
  std::map<std::string, std::int64_t> counts_;
};

// The special tokens in vocab.txt order for `unused_tokens` unused slots.
std::vector<std::string> special_tokens(int unused_tokens);

// Returns the tokens of vocab.txt in id order.
std::vector<std::string>
build_wordpiece_vocab(const std::map<std::string, std::int64_t>& word_counts,
                      const vocab_build_options& options);

} // namespace dsa::tok
