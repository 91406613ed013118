// Shuffle-buffer streaming over pre-training shards with a replayable cursor.
#include "io/data/shard_reader.hpp"

#include <tuple>

namespace dsa::data {
namespace {

std::uint64_t splitmix_next(std::uint64_t& state) {
  state += 0x9E3779B97F4A7C15ull;
  std::uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, n) by rejection.
std::uint64_t splitmix_below(std::uint64_t& state, std::uint64_t n) {
  std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % n + 1) % n;
  std::uint64_t x;
  do {
    x = splitmix_next(state);
  } while (x > limit);
  return x % n;
}

} // namespace

expected<shard_reader> shard_reader::open(std::vector<std::string> paths,
                                          shard_reader_options options) {
  if (paths.empty())
    return make_error(errc::invalid_argument, "shard reader: no shard files given");
  if (options.shuffle_buffer < 1)
    return make_error(errc::invalid_argument, "shard reader: shuffle_buffer {} must be >= 1",
                      options.shuffle_buffer);
  if (options.masking == masking_source::dynamic && options.vocab.random_ids.empty())
    return make_error(errc::invalid_argument, "shard reader: dynamic masking needs a vocabulary");
  shard_reader r;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    DSA_ASSIGN_OR_RETURN(auto file, ckpt::read_safetensors_header(paths[i]));
    DSA_ASSIGN_OR_RETURN(shard_header header, read_shard_header(paths[i], file.metadata));
    const shard_layout& layout = header.layout;
    if (i == 0) {
      r.layout_ = layout;
    } else if (layout.seq_length != r.layout_.seq_length ||
               layout.max_predictions != r.layout_.max_predictions) {
      return make_error(errc::format,
                        "shard '{}' has seq_length {} / max_predictions {}, '{}' has {} / {}",
                        paths[i], layout.seq_length, layout.max_predictions, paths[0],
                        r.layout_.seq_length, r.layout_.max_predictions);
    } else if (layout.vocab_size != r.layout_.vocab_size || layout.vocab != r.layout_.vocab) {
      return make_error(errc::format,
                        "shard '{}' and '{}' come from different vocabularies (vocab_size {} and "
                        "{}, vocab_fingerprint '{}' and '{}')",
                        paths[i], paths[0], layout.vocab_size, r.layout_.vocab_size,
                        layout.vocab.fingerprint, r.layout_.vocab.fingerprint);
    }
    const std::int64_t count = header.count;
    r.counts_.push_back(count);
    r.total_ += count;
  }
  r.paths_ = std::move(paths);
  r.options_ = std::move(options);
  r.start_epoch(0);
  return r;
}

void shard_reader::start_epoch(std::uint64_t epoch) {
  state_ = index_state{};
  state_.epoch = epoch;
  state_.rng = derive_seed(options_.seed, epoch, 2);
  state_.order.resize(paths_.size());
  for (std::size_t i = 0; i < paths_.size(); ++i)
    state_.order[i] = static_cast<std::uint32_t>(i);
  if (options_.order == shard_order::shuffled) {
    prep_rng rng(derive_seed(options_.seed, epoch, 1));
    rng.shuffle(state_.order);
  }
  pending_.assign(counts_.begin(), counts_.end());
  cache_.clear();
  fill();
}

void shard_reader::fill() {
  while (static_cast<std::int64_t>(state_.buffer.size()) < options_.shuffle_buffer &&
         state_.stream_shard < state_.order.size()) {
    std::uint32_t shard = state_.order[state_.stream_shard];
    if (state_.stream_row >= static_cast<std::uint64_t>(counts_[shard])) {
      ++state_.stream_shard;
      state_.stream_row = 0;
      continue;
    }
    state_.buffer.emplace_back(shard, static_cast<std::uint32_t>(state_.stream_row++));
  }
  // Normalise so that the cursor names the next row that exists.
  while (state_.stream_shard < state_.order.size() &&
         state_.stream_row >=
             static_cast<std::uint64_t>(counts_[state_.order[state_.stream_shard]])) {
    ++state_.stream_shard;
    state_.stream_row = 0;
  }
}

bool shard_reader::next_index(std::uint32_t& shard, std::uint32_t& row) {
  if (state_.buffer.empty())
    return false;
  auto j = static_cast<std::size_t>(splitmix_below(state_.rng, state_.buffer.size()));
  std::tie(shard, row) = state_.buffer[j];
  state_.buffer[j] = state_.buffer.back();
  state_.buffer.pop_back();
  ++state_.emitted;
  fill();
  return true;
}

std::int64_t shard_reader::resident_bound(std::int64_t seq_length, std::int64_t max_predictions) {
  // One row's six slices, each within its dropped windows (two when it straddles one), and
  // a shard load's check, which gives its pages back every 1,024 rows.
  const std::int64_t w = pretrain_shard::row_window_bytes;
  auto windows = [&](std::int64_t bytes) { return ((bytes + w - 1) / w + 1) * w; };
  const std::int64_t row = 3 * windows(4 * seq_length) + 2 * windows(4 * max_predictions) + windows(4);
  const std::int64_t check = 1024 * 4 * (3 * seq_length + 2 * max_predictions + 1) + 6 * 64 * 1024;
  return std::max(row, check);
}

expected<const pretrain_shard*> shard_reader::shard_data(std::uint32_t shard) {
  auto it = cache_.find(shard);
  if (it == cache_.end()) {
    DSA_ASSIGN_OR_RETURN(auto loaded, pretrain_shard::load(paths_[shard]));
    if (loaded.count() != counts_[shard] || loaded.layout().seq_length != layout_.seq_length ||
        loaded.layout().max_predictions != layout_.max_predictions)
      return make_error(errc::format, "shard '{}' changed since the reader opened it",
                        paths_[shard]);
    loaded.release_pages(); // what the load's checks read
    it = cache_.emplace(shard, std::make_shared<pretrain_shard>(std::move(loaded))).first;
  }
  return it->second.get();
}

expected<bool> shard_reader::next(pretrain_instance& out) {
  std::uint32_t shard = 0, row = 0;
  while (!next_index(shard, row)) {
    if (options_.epochs > 0 && state_.epoch + 1 >= static_cast<std::uint64_t>(options_.epochs))
      return false;
    if (total_ == 0)
      return false;
    start_epoch(state_.epoch + 1);
  }
  DSA_ASSIGN_OR_RETURN(const pretrain_shard* data, shard_data(shard));
  out = data->row(row); // which gives the row's pages back (pretrain_shard::row)
  if (--pending_[shard] == 0)
    cache_.erase(shard); // every row of it has been emitted
  if (options_.masking == masking_source::dynamic) {
    unmask_instance(out);
    prep_rng rng(derive_seed(options_.seed ^ 0x6d61736bull, state_.epoch,
                             (std::uint64_t{shard} << 32) | row));
    mask_instance(out, options_.vocab, options_.dynamic_masking, rng);
  }
  return true;
}

std::int64_t shard_reader::skip(std::int64_t count) {
  std::int64_t passed = 0;
  std::uint32_t shard = 0, row = 0;
  while (passed < count) {
    if (!next_index(shard, row)) {
      if ((options_.epochs > 0 && state_.epoch + 1 >= static_cast<std::uint64_t>(options_.epochs)) || total_ == 0)
        break;
      start_epoch(state_.epoch + 1);
      continue;
    }
    if (--pending_[shard] == 0)
      cache_.erase(shard); // as next(): every row of it has been passed
    ++passed;
  }
  return passed;
}

expected<ckpt::named_tensors> shard_reader::next_batch(std::int64_t batch) {
  std::vector<pretrain_instance> rows;
  rows.reserve(static_cast<std::size_t>(batch));
  pretrain_instance inst;
  while (static_cast<std::int64_t>(rows.size()) < batch) {
    DSA_ASSIGN_OR_RETURN(bool more, next(inst));
    if (!more)
      break;
    rows.push_back(std::move(inst));
  }
  return pack_instances(rows, 0, rows.size(), layout_);
}

shard_cursor shard_reader::cursor() const {
  return {state_.epoch, state_.emitted, state_.stream_shard, state_.stream_row, state_.rng};
}

status shard_reader::seek(const shard_cursor& cursor) {
  if (cursor.emitted > static_cast<std::uint64_t>(total_))
    return make_error(errc::invalid_argument, "data cursor emitted {} of an epoch of {} instances",
                      cursor.emitted, total_);
  start_epoch(cursor.epoch);
  std::uint32_t shard = 0, row = 0;
  while (state_.emitted < cursor.emitted && next_index(shard, row)) {
  }
  pending_.assign(counts_.begin(), counts_.end());
  // Rows already emitted this epoch: all rows streamed in minus those still buffered.
  for (std::uint64_t s = 0; s < state_.stream_shard && s < state_.order.size(); ++s)
    pending_[state_.order[s]] = 0;
  if (state_.stream_shard < state_.order.size())
    pending_[state_.order[state_.stream_shard]] -= static_cast<std::int64_t>(state_.stream_row);
  for (const auto& [s, r] : state_.buffer)
    ++pending_[s];
  (void)row;
  if (!(this->cursor() == cursor))
    return make_error(
        errc::invalid_argument,
        "data cursor (epoch {}, emitted {}, shard {}, position {}) does not match these {} shards",
        cursor.epoch, cursor.emitted, cursor.shard, cursor.position, paths_.size());
  return {};
}

} // namespace dsa::data
