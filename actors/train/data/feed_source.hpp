// Data for a run: a provider of BERT micro-batches (pre-training shards or
// SQuAD features) and the runtime's batch_source over it. The feeder fills
// micro-batches strictly in (step, micro-batch) order; the source records the
// provider's cursor after each step's last micro-batch, so a checkpoint taken
// after step k resumes the data exactly at step k + 1.
#pragma once

#include "actors/compute.hpp"
#include "actors/train/data/batch_packing.hpp"
#include "io/data/shard_reader.hpp"
#include "io/data/squad_features.hpp"
#include "models/bert/bert_batch.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace dsa::train {

using data_cursor = std::vector<std::uint64_t>;

class batch_provider {
public:
  virtual ~batch_provider() = default;
  // The next `rows` training rows (wrapping around epochs).
  virtual bert::bert_batch next(std::int64_t rows) = 0;
  virtual data_cursor cursor() const = 0;
  virtual status seek(const data_cursor& c) = 0;
  virtual std::int64_t rows_per_epoch() const = 0;
  // Skips `rows` training rows as next() would read them.
  virtual void skip(std::int64_t rows) { (void)next(rows); }
  // An independent provider at the same position (a data-parallel rank's own).
  virtual std::unique_ptr<batch_provider> clone() const = 0;
};

// Pre-training shards through data::shard_reader (endless epochs).
class pretrain_provider final : public batch_provider {
public:
  explicit pretrain_provider(data::shard_reader reader) : reader_(std::move(reader)) {}
  bert::bert_batch next(std::int64_t rows) override;
  data_cursor cursor() const override;
  status seek(const data_cursor& c) override;
  std::int64_t rows_per_epoch() const override { return reader_.instances_per_epoch(); }
  std::unique_ptr<batch_provider> clone() const override { return std::make_unique<pretrain_provider>(*this); }
  // Passes the rows by index only (no read, no masking).
  void skip(std::int64_t rows) override { reader_.skip(rows); }

private:
  data::shard_reader reader_;
};

// SQuAD training features, reshuffled every epoch by a seeded permutation.
class squad_provider final : public batch_provider {
public:
  squad_provider(std::vector<data::squad_feature> features, std::uint64_t seed);
  bert::bert_batch next(std::int64_t rows) override;
  data_cursor cursor() const override { return {epoch_, position_}; }
  status seek(const data_cursor& c) override;
  std::int64_t rows_per_epoch() const override { return static_cast<std::int64_t>(features_.size()); }
  void skip(std::int64_t rows) override;
  std::unique_ptr<batch_provider> clone() const override { return std::make_unique<squad_provider>(*this); }

private:
  void shuffle_epoch();
  std::vector<data::squad_feature> features_;
  std::vector<std::uint32_t> order_;
  std::uint64_t seed_;
  std::uint64_t epoch_ = 0, position_ = 0;
};

// Pre-training shard tensors (shard_reader::next_batch) as model input.
bert::bert_batch pretrain_batch(const ckpt::named_tensors& t);

// Turns a batch of features into model input (evaluation uses it too).
bert::bert_batch squad_batch(const std::vector<data::squad_feature>& features, std::size_t begin, std::size_t end);

// Which share of each step's global batch a source feeds: rank r of R, each rank
// filling M micro-batches of a global M x R. Rank r's micro-batch m is the global
// micro-batch r x M + m; the source reads (and drops) the rows of the other ranks'
// micro-batches, so every rank's provider ends each step at the same position, the
// one a single rank with M x R micro-batches reaches.
struct feed_share {
  int rank = 0, ranks = 1;
  std::uint32_t micro_batches = 1; // M, per rank
};

class feed_source final : public actors::batch_source {
public:
  feed_source(batch_provider& provider, std::int64_t micro_batch_size, bert::head_kind head, feed_share share = {});
  void fill(std::uint32_t step, std::uint32_t micro_batch, tensor& input, tensor& labels) override;
  // The provider's cursor (the feeder asks after a step's last fill; a checkpoint stores it).
  std::vector<std::uint64_t> position() const override;

private:
  batch_provider& provider_;
  std::int64_t rows_;
  bert::head_kind head_;
  feed_share share_;
};

} // namespace dsa::train
