// WordPiece vocabulary learning on a tiny corpus: layout, size bound, determinism.
#include "models/tokenizer/vocab_builder.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <set>

using namespace dsa::tok;

namespace {
std::map<std::string, std::int64_t> tiny_counts() {
  word_counter counter{tokenizer_options{}};
  for (int i = 0; i < 3; ++i) {
    counter.add_text("The unaffable runner was running and the runners ran.");
    counter.add_text("Unaffable, unable, unhappy: the run is done!");
  }
  return counter.counts();
}
} // namespace

TEST_CASE("vocab builder: special tokens first, then characters, then pieces") {
  vocab_build_options options;
  options.size = 80;
  options.unused_tokens = 3;
  auto tokens = build_wordpiece_vocab(tiny_counts(), options);
  REQUIRE(tokens.size() <= 80u);
  std::vector<std::string> head(tokens.begin(), tokens.begin() + 8);
  CHECK(head == std::vector<std::string>{"[PAD]", "[unused0]", "[unused1]", "[unused2]", "[UNK]",
                                         "[CLS]", "[SEP]", "[MASK]"});
  CHECK(std::set<std::string>(tokens.begin(), tokens.end()).size() ==
        tokens.size()); // no duplicates
  // Characters: word-initial then "##" forms; both forms of 'u' appear.
  CHECK(std::find(tokens.begin(), tokens.end(), "u") != tokens.end());
  CHECK(std::find(tokens.begin(), tokens.end(), "##u") != tokens.end());
  CHECK(std::find(tokens.begin(), tokens.end(), "!") != tokens.end());
  auto first_hash =
      std::find_if(tokens.begin(), tokens.end(), [](auto& t) { return t.rfind("##", 0) == 0; });
  CHECK(*first_hash == "##!"); // by code point
  CHECK(*(first_hash - 1) == "y");
  // Frequent words become single pieces; every word of the corpus tokenizes without [UNK].
  CHECK(std::find(tokens.begin(), tokens.end(), "the") != tokens.end());
  bert_tokenizer tok(vocab::from_tokens(tokens));
  for (auto& piece : tok.tokenize("the unaffable runners are unhappy"))
    CHECK(piece != "[UNK]");
}

TEST_CASE("vocab builder: size is respected and the result is deterministic") {
  for (int size : {20, 40, 60, 200}) {
    vocab_build_options options;
    options.size = size;
    options.unused_tokens = 2;
    auto a = build_wordpiece_vocab(tiny_counts(), options);
    auto b = build_wordpiece_vocab(tiny_counts(), options);
    CHECK(a.size() <= static_cast<std::size_t>(size));
    CHECK(a == b);
    if (size == 20)
      CHECK(a.size() == 20u); // characters truncated to the budget
  }
  // Learning stops when no pair repeats: a large budget is not filled with noise.
  vocab_build_options big;
  big.size = 5000;
  auto tokens = build_wordpiece_vocab(tiny_counts(), big);
  CHECK(tokens.size() < 5000u);
}
