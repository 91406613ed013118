// Pre-training shard files: safetensors holding int32 arrays, B instances of
// sequence length T and at most P masked positions each:
//   input_ids            i32 (B, T)  [CLS] A [SEP] B [SEP] after masking, then 0 ([PAD] id) padding
//   token_type_ids       i32 (B, T)  0 for [CLS] A [SEP], 1 for B [SEP], 0 padding
//   attention_mask       i32 (B, T)  1 for real tokens, 0 padding
//   masked_lm_positions  i32 (B, P)  ascending positions of the targets, 0 padding
//   masked_lm_ids        i32 (B, P)  original ids at those positions, -1 padding (the loss ignores
//   -1) next_sentence_labels i32 (B)     0 = B follows A, 1 = B is random (BERT's convention)
// "__metadata__": format = "dsactor-pretrain-v1", seq_length = T, max_predictions = P,
// vocab_size, count = B, the vocabulary's cls_id, sep_id, mask_id, pad_id and
// vocab_fingerprint (shards written before these five have only vocab_size), and
// the generation parameters (seed, dupe_factor, short_seq_prob, masked_lm_prob,
// whole_word), all as strings. Training reads the vocabulary size from here, so a
// run from shards needs no vocab.txt.
// Shards of one data set are named <prefix>-00000.safetensors, -00001, ...
#pragma once

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "io/ckpt/safetensors.hpp"
#include "io/data/pretrain_instance.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::data {

inline constexpr const char* pretrain_shard_format = "dsactor-pretrain-v1";

// What a shard records of the vocabulary its ids come from, besides its size.
// Absent in older shards: ids -1, fingerprint empty.
struct shard_vocab_info {
  std::int32_t cls_id = -1, sep_id = -1, mask_id = -1, pad_id = -1;
  std::string fingerprint; // 16 hex digits: FNV-1a 64 of the tokens, each followed by '\n'

  bool operator==(const shard_vocab_info& o) const;
  bool operator!=(const shard_vocab_info& o) const { return !(*this == o); }
};

struct shard_layout {
  int seq_length = 128;     // T
  int max_predictions = 20; // P
  std::int32_t vocab_size = 0;
  shard_vocab_info vocab;
};

// The vocabulary facts of `v` as shards record them.
shard_vocab_info shard_vocab_of(const tok::vocab& v);

// A shard's layout and row count from its metadata (errc::format naming the file
// and the key when the format tag or a count is missing or malformed).
struct shard_header {
  shard_layout layout;
  std::int64_t count = 0;
};
expected<shard_header> read_shard_header(const std::string& path, const ckpt::metadata_map& meta);

// Whether `v` (read from `vocab_path`) is the vocabulary the shard at `shard_path`
// was written with: the same size and, where the shard records them, the same
// special ids and fingerprint. errc::config naming both files and what differs.
status check_shard_vocab(const shard_layout& layout, const std::string& shard_path,
                         const tok::vocab& v, const std::string& vocab_path);

// Pads instances[begin, end) into the tensors above.
ckpt::named_tensors pack_instances(const std::vector<pretrain_instance>& instances,
                                   std::size_t begin, std::size_t end, const shard_layout& layout);

// Writes instances[begin, end) as one shard (atomically); `extra` joins the metadata.
status write_pretrain_shard(const std::string& path,
                            const std::vector<pretrain_instance>& instances, std::size_t begin,
                            std::size_t end, const shard_layout& layout,
                            const ckpt::metadata_map& extra = {});

// One loaded shard; rows come back unpadded.
class pretrain_shard {
public:
  // Reads and checks a shard: format tag, tensor names, dtypes and shapes against its
  // metadata, and every row (mask a prefix of ones, targets inside the row and the vocabulary).
  static expected<pretrain_shard> load(const std::string& path);

  std::int64_t count() const { return count_; }
  const shard_layout& layout() const { return layout_; }
  const ckpt::metadata_map& metadata() const { return file_.metadata; }
  // Row i, copied out. A mapped shard then gives the row's pages back (the aligned
  // row_window_bytes around each of its six slices), so reading rows keeps at most one
  // row's windows resident, whatever the shard's size.
  pretrain_instance row(std::int64_t i) const;
  static constexpr std::int64_t row_window_bytes = 256 * 1024;
  // A mapped shard (pretrain_shard::load maps it): gives its pages back (madvise
  // MADV_DONTNEED), so they leave this process's resident set; the page cache keeps them and
  // the next row read maps them again. No-op for a shard read into memory.
  void release_pages() const;

private:
  status check_rows(const std::string& path) const;
  ckpt::safetensors_file file_;
  shard_layout layout_;
  std::int64_t count_ = 0;
};

// The file name of shard `index`: "<prefix>-00003.safetensors".
std::string shard_file_name(const std::string& prefix, std::int64_t index);

} // namespace dsa::data
