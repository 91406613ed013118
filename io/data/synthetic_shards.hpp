// Pre-training shards of random instances, for data sets larger than memory without a
// corpus: benchmarks of the reader and the tests that train through more data than
// limits.host_memory (Megatron's mock data plays the same part). Each instance is
// [CLS] A [SEP] B [SEP] of random word ids, the split and the lengths random, 15% of its
// positions masked (at most max_predictions) as BERT does (80% [MASK], 10% random, 10%
// kept), its next-sentence label random. Written one shard at a time: memory holds one
// shard's instances, whatever the data set's size.
#pragma once

#include "core/error.hpp"

#include <cstdint>
#include <functional>
#include <string>

namespace dsa::data {

struct synthetic_shard_options {
  std::int64_t instances = 10000;
  std::int64_t per_shard = 10000;
  int seq_length = 128;     // T
  int max_predictions = 20; // P
  std::int32_t vocab_size = 1000; // the 5 special tokens and w1 .. w<vocab_size - 5>
  std::uint64_t seed = 1;
};

// Writes <dir>/vocab.txt and <dir>/train-NNNNN.safetensors; progress(instances written,
// total) after each shard. Returns the shard count; errors name the file.
expected<int> write_synthetic_shards(const std::string& dir, const synthetic_shard_options& options,
                                     const std::function<void(std::int64_t, std::int64_t)>& progress = {});

} // namespace dsa::data
