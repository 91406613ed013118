// Masked LM target selection (Google create_pretraining_data semantics).
#include "io/data/pretrain_instance.hpp"

#include <algorithm>
#include <cmath>

namespace dsa::data {

masking_vocab masking_vocab::from(const tok::vocab& v) {
  masking_vocab m;
  m.cls_id = v.cls_id();
  m.sep_id = v.sep_id();
  m.mask_id = v.mask_id();
  m.pad_id = v.pad_id();
  m.is_continuation.resize(static_cast<std::size_t>(v.size()));
  for (std::int32_t id = 0; id < v.size(); ++id) {
    const std::string& t = v.token(id);
    m.is_continuation[static_cast<std::size_t>(id)] = t.rfind("##", 0) == 0;
    bool special = t.size() >= 2 && t.front() == '[' && t.back() == ']';
    if (!special)
      m.random_ids.push_back(id);
  }
  DSA_CHECK(!m.random_ids.empty(), "vocabulary of {} tokens has only special tokens", v.size());
  return m;
}

void mask_instance(pretrain_instance& instance, const masking_vocab& vocab,
                   const masking_options& options, prep_rng& rng) {
  const auto& tokens = instance.input_ids;
  std::vector<std::vector<std::int32_t>> candidates;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    std::int32_t t = tokens[i];
    if (t == vocab.cls_id || t == vocab.sep_id)
      continue;
    bool continuation = t >= 0 && static_cast<std::size_t>(t) < vocab.is_continuation.size() &&
                        vocab.is_continuation[static_cast<std::size_t>(t)];
    if (options.mode == word_masking::whole_word && continuation && !candidates.empty() &&
        candidates.back().back() == static_cast<std::int32_t>(i) - 1)
      candidates.back().push_back(static_cast<std::int32_t>(i));
    else
      candidates.push_back({static_cast<std::int32_t>(i)});
  }
  rng.shuffle(candidates);

  const std::size_t num_to_predict = std::min<std::size_t>(
      static_cast<std::size_t>(std::max(0, options.max_predictions)),
      std::max<std::size_t>(
          1, static_cast<std::size_t>(std::llround(tokens.size() * options.masked_lm_prob))));
  std::vector<std::int32_t> output = tokens;
  std::vector<std::int32_t> positions;
  std::vector<std::uint8_t> covered(tokens.size(), 0);
  for (const auto& word : candidates) {
    if (positions.size() >= num_to_predict)
      break;
    if (positions.size() + word.size() > num_to_predict)
      continue;
    bool any_covered = false;
    for (auto i : word)
      any_covered = any_covered || covered[static_cast<std::size_t>(i)];
    if (any_covered)
      continue;
    for (auto i : word) {
      covered[static_cast<std::size_t>(i)] = 1;
      std::int32_t replacement;
      if (rng.uniform_real() < 0.8) {
        replacement = vocab.mask_id;
      } else if (rng.uniform_real() < 0.5) {
        replacement = tokens[static_cast<std::size_t>(i)];
      } else {
        auto k = rng.uniform_int(0, static_cast<std::int64_t>(vocab.random_ids.size()) - 1);
        replacement = vocab.random_ids[static_cast<std::size_t>(k)];
      }
      output[static_cast<std::size_t>(i)] = replacement;
      positions.push_back(i);
    }
  }
  std::sort(positions.begin(), positions.end());
  instance.masked_lm_positions = positions;
  instance.masked_lm_ids.clear();
  for (auto p : positions)
    instance.masked_lm_ids.push_back(tokens[static_cast<std::size_t>(p)]);
  instance.input_ids = std::move(output);
}

void unmask_instance(pretrain_instance& instance) {
  for (std::size_t j = 0; j < instance.masked_lm_positions.size(); ++j)
    instance.input_ids[static_cast<std::size_t>(instance.masked_lm_positions[j])] =
        instance.masked_lm_ids[j];
  instance.masked_lm_positions.clear();
  instance.masked_lm_ids.clear();
}

} // namespace dsa::data
