// WordPiece vocabulary learning by greedy pair merges (see vocab_builder.hpp).
#include "models/tokenizer/vocab_builder.hpp"
#include "models/tokenizer/unicode.hpp"

#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

namespace dsa::tok {
namespace {

using symbol_id = std::uint32_t;
using pair_key = std::uint64_t;

pair_key make_key(symbol_id a, symbol_id b) {
  return (static_cast<pair_key>(a) << 32) | b;
}

struct word_entry {
  std::vector<symbol_id> symbols;
  std::int64_t count;
};

// Learner state: the symbol table, the words as symbol sequences and the pair counts.
class merge_learner {
public:
  symbol_id intern(const std::string& s) {
    auto it = ids_.find(s);
    if (it != ids_.end())
      return it->second;
    strings_.push_back(s);
    return ids_[s] = static_cast<symbol_id>(strings_.size() - 1);
  }
  bool known(const std::string& s) const { return ids_.count(s) > 0; }
  const std::string& str(symbol_id id) const { return strings_[id]; }

  void add_word(std::vector<symbol_id> symbols, std::int64_t count) {
    words_.push_back({std::move(symbols), count});
    add_pairs(static_cast<std::uint32_t>(words_.size() - 1), +1);
  }

  void start() {
    for (const auto& [key, count] : pair_counts_)
      heap_.push({count, key});
  }

  // Pops the best live pair; false when none reaches min_count.
  bool best(std::int64_t min_count, pair_key& key) {
    while (!heap_.empty()) {
      entry e = heap_.top();
      heap_.pop();
      auto it = pair_counts_.find(e.key);
      if (it == pair_counts_.end() || it->second != e.count)
        continue; // stale
      if (e.count < min_count)
        return false;
      key = e.key;
      return true;
    }
    return false;
  }

  void merge(pair_key key, symbol_id merged) {
    symbol_id a = static_cast<symbol_id>(key >> 32), b = static_cast<symbol_id>(key);
    std::vector<std::uint32_t> where = std::move(where_[key]);
    where_.erase(key);
    std::sort(where.begin(), where.end());
    where.erase(std::unique(where.begin(), where.end()), where.end());
    for (std::uint32_t w : where) {
      auto& syms = words_[w].symbols;
      bool has = false;
      for (std::size_t i = 0; i + 1 < syms.size() && !has; ++i)
        has = syms[i] == a && syms[i + 1] == b;
      if (!has)
        continue;
      add_pairs(w, -1);
      std::vector<symbol_id> next;
      next.reserve(syms.size());
      for (std::size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b) {
          next.push_back(merged);
          ++i;
        } else {
          next.push_back(syms[i]);
        }
      }
      syms = std::move(next);
      add_pairs(w, +1);
    }
    for (pair_key k : touched_) {
      auto it = pair_counts_.find(k);
      if (it != pair_counts_.end())
        heap_.push({it->second, k});
    }
    touched_.clear();
  }

private:
  struct entry {
    std::int64_t count;
    pair_key key;
  };
  struct entry_order {
    const merge_learner* self;
    // Max-heap: higher count first, then the smaller (left, right) strings.
    bool operator()(const entry& x, const entry& y) const {
      if (x.count != y.count)
        return x.count < y.count;
      const std::string& xa = self->str(static_cast<symbol_id>(x.key >> 32));
      const std::string& ya = self->str(static_cast<symbol_id>(y.key >> 32));
      if (xa != ya)
        return xa > ya;
      return self->str(static_cast<symbol_id>(x.key)) > self->str(static_cast<symbol_id>(y.key));
    }
  };

  void add_pairs(std::uint32_t w, int sign) {
    const auto& syms = words_[w].symbols;
    for (std::size_t i = 0; i + 1 < syms.size(); ++i) {
      pair_key k = make_key(syms[i], syms[i + 1]);
      auto& c = pair_counts_[k];
      c += sign * words_[w].count;
      if (c == 0)
        pair_counts_.erase(k);
      if (sign > 0)
        where_[k].push_back(w);
      touched_.insert(k);
    }
  }

  std::vector<std::string> strings_;
  std::unordered_map<std::string, symbol_id> ids_;
  std::vector<word_entry> words_;
  std::unordered_map<pair_key, std::int64_t> pair_counts_;
  std::unordered_map<pair_key, std::vector<std::uint32_t>> where_;
  std::unordered_set<pair_key> touched_;
  std::priority_queue<entry, std::vector<entry>, entry_order> heap_{entry_order{this}};
};

std::string char_string(char32_t cp, bool continuation) {
  std::string s = continuation ? "##" : "";
  utf8_append(s, cp);
  return s;
}

} // namespace

void word_counter::add_text(std::string_view text) {
  for (auto& word : basic_tokenize(text, options_))
    ++counts_[word];
}

std::vector<std::string> special_tokens(int unused_tokens) {
  std::vector<std::string> out{"[PAD]"};
  for (int i = 0; i < unused_tokens; ++i)
    out.push_back("[unused" + std::to_string(i) + "]");
  for (const char* s : {"[UNK]", "[CLS]", "[SEP]", "[MASK]"})
    out.emplace_back(s);
  return out;
}

std::vector<std::string>
build_wordpiece_vocab(const std::map<std::string, std::int64_t>& word_counts,
                      const vocab_build_options& options) {
  std::vector<std::string> vocab = special_tokens(options.unused_tokens);
  DSA_CHECK(options.size > static_cast<int>(vocab.size()),
            "vocabulary size {} leaves no room after {} special tokens", options.size,
            vocab.size());

  // Character frequencies of both forms; keep the most frequent that fit.
  std::map<std::string, std::int64_t> char_counts;
  std::vector<std::pair<std::u32string, std::int64_t>> words;
  for (const auto& [word, count] : word_counts) {
    std::u32string cps = utf8_decode(word);
    for (std::size_t i = 0; i < cps.size(); ++i) {
      char_counts[char_string(cps[i], false)] += i == 0 ? count : 0;
      char_counts[char_string(cps[i], true)] += i > 0 ? count : 0;
    }
    words.emplace_back(std::move(cps), count);
  }
  std::vector<std::pair<std::string, std::int64_t>> chars(char_counts.begin(), char_counts.end());
  std::size_t budget = static_cast<std::size_t>(options.size) - vocab.size();
  if (chars.size() > budget) {
    std::stable_sort(chars.begin(), chars.end(),
                     [](const auto& x, const auto& y) { return x.second > y.second; });
    chars.resize(budget);
  }
  // BERT's order: word-initial characters, then continuations, each by code point.
  std::sort(chars.begin(), chars.end(), [](const auto& x, const auto& y) {
    bool xc = x.first.rfind("##", 0) == 0, yc = y.first.rfind("##", 0) == 0;
    if (xc != yc)
      return yc;
    return utf8_decode(x.first) < utf8_decode(y.first);
  });
  merge_learner learner;
  for (const auto& c : chars) {
    vocab.push_back(c.first);
    learner.intern(c.first);
  }

  for (const auto& [cps, count] : words) {
    std::vector<symbol_id> syms;
    bool ok = true;
    for (std::size_t i = 0; i < cps.size() && ok; ++i) {
      std::string s = char_string(cps[i], i > 0);
      ok = learner.known(s);
      if (ok)
        syms.push_back(learner.intern(s));
    }
    if (ok && syms.size() > 1)
      learner.add_word(std::move(syms), count);
  }
  learner.start();

  std::int64_t merges = 0;
  pair_key key = 0;
  while (static_cast<int>(vocab.size()) < options.size &&
         learner.best(options.min_pair_count, key)) {
    const std::string& left = learner.str(static_cast<symbol_id>(key >> 32));
    const std::string& right = learner.str(static_cast<symbol_id>(key));
    std::string merged = left + right.substr(right.rfind("##", 0) == 0 ? 2 : 0);
    bool fresh = !learner.known(merged);
    symbol_id id = learner.intern(merged);
    if (fresh)
      vocab.push_back(merged);
    learner.merge(key, id);
    ++merges;
    if (options.progress && options.progress_every > 0 && merges % options.progress_every == 0)
      options.progress(merges, static_cast<std::int64_t>(vocab.size()));
  }
  return vocab;
}

} // namespace dsa::tok
