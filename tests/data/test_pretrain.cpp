// Pre-training instances: layout, masking proportions, NSP balance, determinism.
#include "io/data/pretrain_builder.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <set>

using namespace dsa::data;
using dsa::tok::vocab;

namespace {

// [PAD] [UNK] [CLS] [SEP] [MASK] [unused0], 200 words w0.., 50 pieces ##x0..
vocab synthetic_vocab() {
  std::vector<std::string> t{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]"};
  for (int i = 0; i < 200; ++i)
    t.push_back("w" + std::to_string(i));
  for (int i = 0; i < 50; ++i)
    t.push_back("##x" + std::to_string(i));
  return vocab::from_tokens(t);
}

// 80 documents of 2..30 sentences of 1..25 tokens; about one token in four is a "##" piece.
std::vector<tokenized_document> synthetic_documents(std::uint64_t seed) {
  prep_rng rng(seed);
  std::vector<tokenized_document> docs(80);
  for (auto& d : docs) {
    d.resize(static_cast<std::size_t>(rng.uniform_int(2, 30)));
    for (auto& s : d) {
      auto n = rng.uniform_int(1, 25);
      for (std::int64_t k = 0; k < n; ++k)
        s.push_back(static_cast<std::int32_t>(k > 0 && rng.uniform_real() < 0.25
                                                  ? rng.uniform_int(206, 255)
                                                  : rng.uniform_int(6, 205)));
    }
  }
  return docs;
}

std::vector<pretrain_instance> make(std::uint64_t seed, word_masking mode = word_masking::per_token,
                                    int seq = 128) {
  pretrain_options o;
  o.max_seq_length = seq;
  o.dupe_factor = 3;
  o.seed = seed;
  o.masking.mode = mode;
  return create_pretraining_instances(synthetic_documents(7),
                                      masking_vocab::from(synthetic_vocab()), o);
}

} // namespace

TEST_CASE("pretrain: [CLS] A [SEP] B [SEP] layout, token types and lengths") {
  for (int seq : {128, 512}) {
    auto all = make(12345, word_masking::per_token, seq);
    REQUIRE(all.size() > 300u);
    std::size_t short_ones = 0;
    for (const auto& inst : all) {
      const auto& ids = inst.input_ids;
      REQUIRE(ids.size() <= static_cast<std::size_t>(seq));
      REQUIRE(ids.size() == inst.token_type_ids.size());
      CHECK(ids.front() == 2);
      CHECK(ids.back() == 3);
      std::vector<std::size_t> seps;
      for (std::size_t i = 0; i < ids.size(); ++i)
        if (ids[i] == 3)
          seps.push_back(i);
      REQUIRE(seps.size() == 2);     // [SEP] is never masked and never drawn as a random token
      CHECK(seps[0] >= 2);           // A is not empty
      CHECK(seps[1] >= seps[0] + 2); // B is not empty
      for (std::size_t i = 0; i < ids.size(); ++i)
        CHECK(inst.token_type_ids[i] == (i <= seps[0] ? 0 : 1));
      for (auto p : inst.masked_lm_positions)
        CHECK((p > 0 && p != static_cast<std::int32_t>(seps[0]) &&
               p != static_cast<std::int32_t>(seps[1])));
      short_ones += ids.size() < static_cast<std::size_t>(seq) / 2;
    }
    CHECK(short_ones > 0); // short_seq_prob and document ends give short instances
  }
}

TEST_CASE("pretrain: masked LM takes ~15% of tokens, split 80/10/10") {
  auto all = make(12345);
  std::int64_t non_special = 0, masked = 0, as_mask = 0, kept = 0, replaced = 0;
  for (const auto& inst : all) {
    auto len = static_cast<std::int64_t>(inst.input_ids.size());
    non_special += len - 3;
    std::int64_t expect =
        std::min<std::int64_t>(20, std::max<std::int64_t>(1, std::llround(len * 0.15)));
    CHECK(static_cast<std::int64_t>(inst.masked_lm_positions.size()) == expect);
    for (std::size_t j = 0; j < inst.masked_lm_positions.size(); ++j) {
      if (j > 0)
        CHECK(inst.masked_lm_positions[j] > inst.masked_lm_positions[j - 1]);
      auto now = inst.input_ids[static_cast<std::size_t>(inst.masked_lm_positions[j])];
      ++masked;
      if (now == 4)
        ++as_mask;
      else if (now == inst.masked_lm_ids[j])
        ++kept;
      else
        ++replaced;
      CHECK(inst.masked_lm_ids[j] >= 6);
    }
  }
  double rate = static_cast<double>(masked) / static_cast<double>(non_special);
  // Google rounds 15% of the length counting [CLS] and two [SEP]: slightly above 15% of the rest.
  CHECK(rate > 0.14);
  CHECK(rate < 0.17);
  double n = static_cast<double>(masked);
  REQUIRE(n > 5000);
  // Binomial standard deviations at n > 5000 are below 0.006 (0.8) and 0.0043 (0.1): five of them.
  CHECK(std::abs(as_mask / n - 0.8) < 0.03);
  CHECK(std::abs(kept / n - 0.1) < 0.022);
  CHECK(std::abs(replaced / n - 0.1) < 0.022);
}

TEST_CASE("pretrain: next sentence labels are balanced") {
  auto all = make(12345);
  double random_next = 0;
  for (const auto& inst : all)
    random_next += inst.next_sentence_label;
  double share = random_next / static_cast<double>(all.size());
  // 50% by coin, plus chunks of one sentence which are always random (Google's rule):
  // the share sits a little above one half.
  CHECK(share > 0.47);
  CHECK(share < 0.62);
}

TEST_CASE("pretrain: whole-word masking masks a word's pieces together") {
  auto all = make(99, word_masking::whole_word);
  auto v = masking_vocab::from(synthetic_vocab());
  std::int64_t continuation_targets = 0;
  for (const auto& inst : all) {
    std::set<std::int32_t> masked(inst.masked_lm_positions.begin(), inst.masked_lm_positions.end());
    std::vector<std::int32_t> original = inst.input_ids;
    for (std::size_t j = 0; j < inst.masked_lm_positions.size(); ++j)
      original[static_cast<std::size_t>(inst.masked_lm_positions[j])] = inst.masked_lm_ids[j];
    for (std::size_t i = 1; i < original.size(); ++i) {
      bool cont = v.is_continuation[static_cast<std::size_t>(original[i])];
      bool prev_word = original[i - 1] != 2 && original[i - 1] != 3;
      if (cont && prev_word) {
        CHECK(masked.count(static_cast<std::int32_t>(i)) ==
              masked.count(static_cast<std::int32_t>(i - 1)));
        continuation_targets += masked.count(static_cast<std::int32_t>(i));
      }
    }
    CHECK(inst.masked_lm_positions.size() <= 20u);
  }
  CHECK(continuation_targets > 100);
}

TEST_CASE("pretrain: the same seed gives the same instances, another seed others") {
  auto a = make(2024), b = make(2024), c = make(2025);
  REQUIRE(a.size() == b.size());
  bool all_equal = true, differs = a.size() != c.size();
  for (std::size_t i = 0; i < a.size(); ++i) {
    all_equal = all_equal && a[i].input_ids == b[i].input_ids &&
                a[i].masked_lm_ids == b[i].masked_lm_ids &&
                a[i].masked_lm_positions == b[i].masked_lm_positions &&
                a[i].next_sentence_label == b[i].next_sentence_label;
    if (i < c.size())
      differs = differs || a[i].input_ids != c[i].input_ids;
  }
  CHECK(all_equal);
  CHECK(differs);
}

TEST_CASE("pretrain: truncate_seq_pair trims the longer segment") {
  prep_rng rng(1);
  std::vector<std::int32_t> a(10, 1), b(3, 2);
  truncate_seq_pair(a, b, 8, rng);
  CHECK(a.size() == 5);
  CHECK(b.size() == 3);
  std::vector<std::int32_t> c{1, 2, 3, 4}, d{5, 6, 7, 8};
  truncate_seq_pair(c, d, 5, rng);
  CHECK(c.size() + d.size() == 5);
  CHECK(c.size() >= 2);
  CHECK(d.size() >= 2);
}

TEST_CASE("pretrain: rng helpers are uniform and stay in range") {
  prep_rng rng(5);
  std::vector<int> hist(7, 0);
  for (int i = 0; i < 70000; ++i) {
    auto x = rng.uniform_int(3, 9);
    REQUIRE(x >= 3);
    REQUIRE(x <= 9);
    ++hist[static_cast<std::size_t>(x - 3)];
  }
  for (int h : hist)
    CHECK(std::abs(h - 10000) < 500); // sd = 93
  for (int i = 0; i < 1000; ++i) {
    double u = rng.uniform_real();
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
  }
  // Known answer: mt19937_64's 10000th output for the default seed is fixed by the standard.
  std::mt19937_64 ref;
  ref.discard(9999);
  CHECK(ref() == 9981545732273789042ull);
}

TEST_CASE("pretrain: holdout split is disjoint and seeded") {
  auto docs = synthetic_documents(3);
  auto [train, held] = split_holdout(docs, 5, 42);
  CHECK(train.size() == docs.size() - 5);
  CHECK(held.size() == 5);
  auto [train2, held2] = split_holdout(docs, 5, 42);
  CHECK(held == held2);
}
