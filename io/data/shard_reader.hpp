// Streams pre-training instances from shards through a shuffle buffer, with a
// cursor of five integers that the runtime checkpoints and resumes from.
//
// Order: each epoch visits the shards in a seeded permutation (derive_seed(seed,
// epoch, 1)) and streams their rows in order into a buffer of `shuffle_buffer`
// instances; each step emits a uniformly chosen buffered instance (a SplitMix64
// generator whose whole state is one integer, reset to derive_seed(seed, epoch, 2)
// at the start of the epoch) and streams the next row in. When the stream runs
// dry the buffer drains, then the next epoch starts. shuffle_buffer = 1 and
// shard_order = in_order give the files' order.
// Resume: the buffer holds only (shard, row) pairs, so seek() replays the index
// stream of the cursor's epoch up to `emitted`, without reading data, and checks
// that it lands on the cursor's shard, position and generator state.
// Dynamic masking re-draws the masked LM targets of every emitted instance with
// a prep_rng seeded by (seed, epoch, shard, row): a pure function of the cursor.
#pragma once

#include "io/ckpt/safetensors.hpp"
#include "io/data/pretrain_instance.hpp"
#include "io/data/pretrain_shard.hpp"

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dsa::data {

struct shard_cursor {
  std::uint64_t epoch = 0;
  std::uint64_t emitted = 0;   // instances emitted so far in this epoch
  std::uint64_t shard = 0;     // index into this epoch's shard order of the next row to stream in
  std::uint64_t position = 0;  // that row within the shard
  std::uint64_t rng_state = 0; // the buffer generator's state

  std::array<std::uint64_t, 5> to_array() const {
    return {epoch, emitted, shard, position, rng_state};
  }
  static shard_cursor from_array(const std::array<std::uint64_t, 5>& a) {
    return {a[0], a[1], a[2], a[3], a[4]};
  }
  bool operator==(const shard_cursor& o) const { return to_array() == o.to_array(); }
};

enum class shard_order : std::uint8_t { shuffled, in_order };
enum class masking_source : std::uint8_t { stored, dynamic };

struct shard_reader_options {
  std::int64_t shuffle_buffer = 4096; // instances held; 1 = no shuffling
  shard_order order = shard_order::shuffled;
  std::uint64_t seed = 0;
  std::int64_t epochs = 0; // 0 = endless; otherwise next() reports the end after this many
  masking_source masking = masking_source::stored;
  masking_options dynamic_masking; // used with masking_source::dynamic
  masking_vocab vocab;             // used with masking_source::dynamic
};

class shard_reader {
public:
  // Reads every shard's header; all must share seq_length and max_predictions.
  static expected<shard_reader> open(std::vector<std::string> paths, shard_reader_options options);

  // The next instance; false at the end of the last epoch (never, when endless).
  expected<bool> next(pretrain_instance& out);
  // Up to `batch` instances packed as the shard tensors (fewer only at the end).
  expected<ckpt::named_tensors> next_batch(std::int64_t batch);

  // Passes over the next `count` instances as next() would, without reading or masking
  // them (data-parallel ranks skip the other ranks' rows); returns how many it passed
  // (fewer only at the end of the last epoch).
  std::int64_t skip(std::int64_t count);

  shard_cursor cursor() const;
  // Continues from `cursor` (taken from a reader over the same shards and options).
  status seek(const shard_cursor& cursor);

  const shard_layout& layout() const { return layout_; }
  std::int64_t instances_per_epoch() const { return total_; }

  // What a reader of shards of sequence length T and P predictions holds resident at most:
  // each row read gives its pages back (pretrain_shard::row), and a shard's load check gives
  // them back every 1,024 rows; in bytes, whatever the data set's size.
  static std::int64_t resident_bound(std::int64_t seq_length, std::int64_t max_predictions);

private:
  struct index_state {
    std::uint64_t epoch = 0, emitted = 0, stream_shard = 0, stream_row = 0, rng = 0;
    std::vector<std::uint32_t> order;                            // shard order of this epoch
    std::vector<std::pair<std::uint32_t, std::uint32_t>> buffer; // (shard, row)
  };
  void start_epoch(std::uint64_t epoch);
  // Advances the index stream by one instance; false when the epoch is exhausted.
  bool next_index(std::uint32_t& shard, std::uint32_t& row);
  void fill();
  expected<const pretrain_shard*> shard_data(std::uint32_t shard);

  std::vector<std::string> paths_;
  std::vector<std::int64_t> counts_;
  std::int64_t total_ = 0;
  shard_reader_options options_;
  shard_layout layout_;
  index_state state_;
  std::map<std::uint32_t, std::shared_ptr<pretrain_shard>> cache_;
  std::vector<std::int64_t> pending_; // rows of each shard not yet emitted this epoch
};

} // namespace dsa::data
