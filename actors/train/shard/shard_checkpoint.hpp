// Checkpoint pieces the shard modes share: the per-rank files' entries gathered over the
// stage's shards, and the 1-bit error-buffer files (each rank's own) of a compressed
// optimizer over several ranks. The group names are in shard_options.hpp.
#pragma once

#include "actors/train/shard/shard_options.hpp"
#include "io/ckpt/checkpoint_dir.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dsa::train {

// Every rank's `mine` (the same length on every rank), rank after rank, through the
// shard's peers (`caller` names the shard for the comms logger); `mine` alone on one rank.
// An error names stage `o.participant` and `what`.
std::vector<std::int64_t> gather_entries(const shard_options& o, const std::string& caller,
                                         const std::vector<std::int64_t>& mine, const char* what);

// A compressed optimizer's error buffers over several ranks: this rank's `errors` staged
// as group checkpoint_errors_group(stage, rank) into ckpt::staging_dir(root, step), then
// every rank's file entries gathered (every file exists when it returns; a rank whose
// write failed, or whose `failure` is set, fails every rank). `extra`: a file this rank
// staged beside them (1-bit LAMB's state, rank 0), listed after the error files.
std::vector<ckpt::checkpoint_file> stage_error_files(const shard_options& o, const std::string& caller,
                                                     const std::string& root, std::uint64_t step,
                                                     const std::map<std::string, tensor>& errors, std::string failure,
                                                     std::optional<ckpt::checkpoint_file> extra);

} // namespace dsa::train
