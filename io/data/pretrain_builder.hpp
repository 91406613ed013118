// Documents -> BERT pre-training instances, with the semantics of Google's
// create_pretraining_data.py (documents shuffled; dupe_factor passes over them;
// a target length of max_seq_length - 3, or with probability short_seq_prob a
// uniform length in [2, max_seq_length - 3]; sentences gathered into a chunk
// until the target is reached; A = the first a_end sentences of the chunk
// (a_end uniform in [1, chunk - 1]); B = the rest, or with probability 0.5 (or
// when the chunk is one sentence) a run of sentences from a random other
// document, the chunk's unused sentences being put back; truncate_seq_pair
// removing from the front or back (50/50) of the longer segment; masked LM as
// in pretrain_instance.hpp; instances shuffled at the end). One prep_rng seeded
// with `seed` drives every choice, so a seed fixes the output.
#pragma once

#include "io/data/corpus.hpp"
#include "io/data/pretrain_instance.hpp"
#include "models/tokenizer/bert_tokenizer.hpp"

#include <cstdint>
#include <functional>
#include <vector>

namespace dsa::data {

// A document as the ids of its sentences (paragraph boundaries are not used).
using tokenized_document = std::vector<std::vector<std::int32_t>>;

struct pretrain_options {
  int max_seq_length = 128;
  int dupe_factor = 5;
  double short_seq_prob = 0.1;
  masking_options masking;
  std::uint64_t seed = 12345;
  // Called after each document of each pass with (documents done, documents total).
  std::function<void(std::int64_t, std::int64_t)> progress;
};

// Tokenizes every sentence; sentences and documents left empty are dropped.
std::vector<tokenized_document> tokenize_documents(const std::vector<document>& documents,
                                                   const tok::bert_tokenizer& tokenizer);

// Splits off `holdout` documents chosen by a seeded shuffle; returns {train, holdout}.
std::pair<std::vector<tokenized_document>, std::vector<tokenized_document>>
split_holdout(std::vector<tokenized_document> documents, std::int64_t holdout, std::uint64_t seed);

// All instances of all passes, shuffled. Each has at most max_seq_length tokens.
std::vector<pretrain_instance>
create_pretraining_instances(std::vector<tokenized_document> documents, const masking_vocab& vocab,
                             const pretrain_options& options);

// Google's truncate_seq_pair: trims the longer of a and b (front or back, 50/50)
// until their total is at most max_tokens.
void truncate_seq_pair(std::vector<std::int32_t>& a, std::vector<std::int32_t>& b,
                       std::size_t max_tokens, prep_rng& rng);

} // namespace dsa::data
