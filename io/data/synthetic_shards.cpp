// Random pre-training shards written one at a time; see synthetic_shards.hpp.
#include "io/data/synthetic_shards.hpp"

#include "io/ckpt/atomic_file.hpp"
#include "io/data/pretrain_shard.hpp"
#include "models/tokenizer/bert_tokenizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>
#include <vector>

namespace dsa::data {
namespace {

tok::vocab synthetic_vocab(std::int32_t size) {
  std::vector<std::string> tokens{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  for (std::int32_t i = 1; static_cast<std::int32_t>(tokens.size()) < size; ++i) tokens.push_back(fmt::format("w{}", i));
  return tok::vocab::from_tokens(std::move(tokens));
}

pretrain_instance random_instance(std::mt19937_64& rng, const tok::vocab& v, const synthetic_shard_options& o) {
  const std::int32_t words = v.size() - 5, first_word = 5;
  auto uniform = [&](std::int64_t lo, std::int64_t hi) { // [lo, hi]
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  const int T = o.seq_length;
  const auto length = static_cast<int>(uniform(std::max(5, T / 2), T)); // with [CLS] and two [SEP]
  const auto a = static_cast<int>(uniform(1, length - 4));
  pretrain_instance x;
  x.input_ids.reserve(static_cast<std::size_t>(length));
  x.input_ids.push_back(v.cls_id());
  for (int i = 0; i < a; ++i) x.input_ids.push_back(first_word + static_cast<std::int32_t>(uniform(0, words - 1)));
  x.input_ids.push_back(v.sep_id());
  while (static_cast<int>(x.input_ids.size()) < length - 1)
    x.input_ids.push_back(first_word + static_cast<std::int32_t>(uniform(0, words - 1)));
  x.input_ids.push_back(v.sep_id());
  x.token_type_ids.assign(x.input_ids.size(), 0);
  std::fill(x.token_type_ids.begin() + a + 2, x.token_type_ids.end(), 1);
  // 15% of the word positions, at most P, ascending.
  std::vector<std::int32_t> candidates;
  for (int i = 1; i < length; ++i)
    if (x.input_ids[static_cast<std::size_t>(i)] >= first_word) candidates.push_back(i);
  std::shuffle(candidates.begin(), candidates.end(), rng);
  const auto k = std::min<std::size_t>({candidates.size(), static_cast<std::size_t>(o.max_predictions),
                                        std::max<std::size_t>(1, (candidates.size() * 15 + 99) / 100)});
  candidates.resize(k);
  std::sort(candidates.begin(), candidates.end());
  for (std::int32_t pos : candidates) {
    auto& id = x.input_ids[static_cast<std::size_t>(pos)];
    x.masked_lm_positions.push_back(pos);
    x.masked_lm_ids.push_back(id);
    const auto roll = uniform(0, 9);
    if (roll < 8) id = v.mask_id();
    else if (roll == 8) id = first_word + static_cast<std::int32_t>(uniform(0, words - 1));
  }
  x.next_sentence_label = static_cast<std::int32_t>(uniform(0, 1));
  return x;
}

} // namespace

expected<int> write_synthetic_shards(const std::string& dir, const synthetic_shard_options& o,
                                     const std::function<void(std::int64_t, std::int64_t)>& progress) {
  if (o.instances < 1 || o.per_shard < 1)
    return make_error(errc::invalid_argument, "synthetic shards: {} instances, {} per shard: both must be >= 1",
                      o.instances, o.per_shard);
  if (o.seq_length < 8 || o.max_predictions < 1 || o.max_predictions > o.seq_length)
    return make_error(errc::invalid_argument,
                      "synthetic shards: sequence length {} (>= 8) and max predictions {} (1 .. the length)",
                      o.seq_length, o.max_predictions);
  if (o.vocab_size < 6) return make_error(errc::invalid_argument, "synthetic shards: vocabulary of {} (>= 6)", o.vocab_size);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(errc::io, "synthetic shards: cannot create '{}': {}", dir, ec.message());
  const tok::vocab v = synthetic_vocab(o.vocab_size);
  std::string text;
  for (const auto& t : v.tokens()) text += t + "\n";
  DSA_TRY(ckpt::write_file_atomic(dir + "/vocab.txt", text));
  const shard_layout layout{o.seq_length, o.max_predictions, v.size(), shard_vocab_of(v)};
  const ckpt::metadata_map meta{{"seed", std::to_string(o.seed)}, {"synthetic", "1"}};
  std::mt19937_64 rng(o.seed);
  int shards = 0;
  std::vector<pretrain_instance> batch;
  for (std::int64_t done = 0; done < o.instances; ++shards) {
    const std::int64_t n = std::min(o.per_shard, o.instances - done);
    batch.clear();
    for (std::int64_t i = 0; i < n; ++i) batch.push_back(random_instance(rng, v, o));
    const std::string path = shard_file_name(dir + "/train", shards);
    DSA_TRY(write_pretrain_shard(path, batch, 0, batch.size(), layout, meta));
    done += n;
    if (progress) progress(done, o.instances);
  }
  return shards;
}

} // namespace dsa::data
