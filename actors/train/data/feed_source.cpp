// Providers of BERT micro-batches and the runtime's source over them.
#include "actors/train/data/feed_source.hpp"

#include <stdexcept>

namespace dsa::train {
namespace {

tensor i32_matrix(std::int64_t rows, std::int64_t cols) { return tensor::empty({rows, cols}, dtype::i32); }

// SplitMix64: one integer of state; a seeded permutation per epoch.
std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

} // namespace

bert::bert_batch pretrain_provider::next(std::int64_t rows) {
  auto tensors = reader_.next_batch(rows);
  if (!tensors) throw std::runtime_error(tensors.err().message);
  auto& t = *tensors;
  if (t.at("input_ids").dim(0) != rows)
    throw std::runtime_error("pre-training data ended early (the reader is endless: this is a bug)");
  return pretrain_batch(t);
}

bert::bert_batch pretrain_batch(const ckpt::named_tensors& t) {
  bert::bert_batch b;
  b.input_ids = t.at("input_ids");
  b.token_type_ids = t.at("token_type_ids");
  b.attention_mask = t.at("attention_mask");
  b.masked_lm_positions = t.at("masked_lm_positions");
  b.masked_lm_ids = t.at("masked_lm_ids");
  b.next_sentence_labels = t.at("next_sentence_labels");
  return b;
}

data_cursor pretrain_provider::cursor() const {
  auto a = reader_.cursor().to_array();
  return data_cursor(a.begin(), a.end());
}

status pretrain_provider::seek(const data_cursor& c) {
  if (c.size() != 5) return make_error(errc::format, "pre-training data cursor has {} numbers, expected 5", c.size());
  return reader_.seek(data::shard_cursor::from_array({c[0], c[1], c[2], c[3], c[4]}));
}

squad_provider::squad_provider(std::vector<data::squad_feature> features, std::uint64_t seed)
    : features_(std::move(features)), seed_(seed) {
  DSA_CHECK(!features_.empty(), "no SQuAD training features");
  shuffle_epoch();
}

void squad_provider::shuffle_epoch() {
  order_.resize(features_.size());
  for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<std::uint32_t>(i);
  std::uint64_t s = seed_ ^ (0xD1B54A32D192ED03ull * (epoch_ + 1));
  for (std::size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[splitmix(s) % i]);
}

bert::bert_batch squad_provider::next(std::int64_t rows) {
  std::vector<data::squad_feature> picked;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (position_ == features_.size()) {
      ++epoch_;
      position_ = 0;
      shuffle_epoch();
    }
    picked.push_back(features_[order_[position_++]]);
  }
  return squad_batch(picked, 0, picked.size());
}

void squad_provider::skip(std::int64_t rows) {
  for (std::int64_t r = 0; r < rows; ++r) {
    if (position_ == features_.size()) {
      ++epoch_;
      position_ = 0;
      shuffle_epoch();
    }
    ++position_;
  }
}

status squad_provider::seek(const data_cursor& c) {
  if (c.size() != 2 || c[1] > features_.size())
    return make_error(errc::format, "SQuAD data cursor does not fit {} features", features_.size());
  epoch_ = c[0];
  position_ = c[1];
  shuffle_epoch();
  return {};
}

bert::bert_batch squad_batch(const std::vector<data::squad_feature>& features, std::size_t begin, std::size_t end) {
  const auto B = static_cast<std::int64_t>(end - begin);
  const auto T = static_cast<std::int64_t>(features[begin].input_ids.size());
  bert::bert_batch b;
  b.input_ids = i32_matrix(B, T);
  b.token_type_ids = i32_matrix(B, T);
  b.attention_mask = i32_matrix(B, T);
  b.start_positions = tensor::empty({B}, dtype::i32);
  b.end_positions = tensor::empty({B}, dtype::i32);
  for (std::int64_t r = 0; r < B; ++r) {
    const auto& f = features[begin + static_cast<std::size_t>(r)];
    for (std::int64_t t = 0; t < T; ++t) {
      b.input_ids.data<std::int32_t>()[r * T + t] = f.input_ids[static_cast<std::size_t>(t)];
      b.token_type_ids.data<std::int32_t>()[r * T + t] = f.token_type_ids[static_cast<std::size_t>(t)];
      b.attention_mask.data<std::int32_t>()[r * T + t] = f.attention_mask[static_cast<std::size_t>(t)];
    }
    b.start_positions.data<std::int32_t>()[r] = f.start_position;
    b.end_positions.data<std::int32_t>()[r] = f.end_position;
  }
  return b;
}

feed_source::feed_source(batch_provider& provider, std::int64_t micro_batch_size, bert::head_kind head,
                         feed_share share)
    : provider_(provider), rows_(micro_batch_size), head_(head), share_(share) {
  DSA_CHECK(share.ranks >= 1 && share.rank >= 0 && share.rank < share.ranks && share.micro_batches >= 1,
            "feed share: rank {} of {}, {} micro-batches", share.rank, share.ranks, share.micro_batches);
}

// The provider streams in fill order, which the feeder keeps: only whether this is
// the step's first or last micro-batch matters (the other ranks' rows lie around them).
void feed_source::fill(std::uint32_t, std::uint32_t micro_batch, tensor& input, tensor& labels) {
  const std::int64_t share_rows = rows_ * share_.micro_batches;
  if (micro_batch == 0 && share_.rank > 0) provider_.skip(share_rows * share_.rank);
  bert::bert_batch b = provider_.next(rows_);
  input = pack_inputs(b);
  labels = pack_labels(b, head_);
  if (micro_batch + 1 == share_.micro_batches && share_.rank + 1 < share_.ranks)
    provider_.skip(share_rows * (share_.ranks - 1 - share_.rank));
}

std::vector<std::uint64_t> feed_source::position() const { return provider_.cursor(); }

} // namespace dsa::train
