// Checkpoint pieces the shard modes share; see shard_checkpoint.hpp.
#include "actors/train/shard/shard_checkpoint.hpp"

#include "actors/data_parallel.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dsa::train {

std::string checkpoint_partition_group(std::uint32_t stage, std::uint32_t rank, std::int64_t part, std::int64_t parts) {
  return parts <= 1 ? fmt::format("optimizer_{}_rank{}", stage, rank)
                    : fmt::format("optimizer_{}_rank{}_part{}", stage, rank, part);
}

std::string checkpoint_lamb_group(std::uint32_t stage) { return fmt::format("onebit_lamb_{}", stage); }

std::string checkpoint_errors_group(std::uint32_t stage, std::uint32_t rank) {
  return fmt::format("onebit_errors_{}_rank{}", stage, rank);
}

std::vector<std::int64_t> gather_entries(const shard_options& o, const std::string& caller,
                                         const std::vector<std::int64_t>& mine, const char* what) {
  if (!o.peers || o.peers->size() == 1) return mine;
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(o.peers->size()));
  // count: the whole output, every rank's share of it one after the other.
  if (auto g = actors::log_collective(o.logger, "all_gather", static_cast<std::int64_t>(all.size()) * 8, caller,
                                      [&] {
                                        return o.peers->allgather(all.data(), mine.data(), dtype::i64,
                                                                  static_cast<std::int64_t>(all.size()));
                                      });
      !g)
    throw std::runtime_error(
        fmt::format("gathering stage {}'s {} from the other ranks: {}", o.participant, what, g.err().message));
  return all;
}

std::vector<ckpt::checkpoint_file> stage_error_files(const shard_options& o, const std::string& caller,
                                                     const std::string& root, std::uint64_t step,
                                                     const std::map<std::string, tensor>& errors, std::string failure,
                                                     std::optional<ckpt::checkpoint_file> extra) {
  const auto stage = o.participant;
  const int ranks = o.peers->size();
  std::vector<std::int64_t> mine{-1, -1};
  if (failure.empty()) {
    const auto staged =
        ckpt::stage_group(root, step, checkpoint_errors_group(stage, static_cast<std::uint32_t>(o.peers->rank())), errors);
    if (staged) mine = {static_cast<std::int64_t>(staged->bytes), static_cast<std::int64_t>(staged->crc32c)};
    else failure = staged.err().message;
  }
  // Every rank joins the gather (-1 for a failed write), so all fail together; it is also
  // the barrier: every file exists when it returns.
  const auto all = gather_entries(o, caller, mine, "error-buffer files");
  if (!failure.empty())
    throw std::runtime_error(fmt::format("writing stage {}'s 1-bit error buffers: {}", stage, failure));
  std::vector<ckpt::checkpoint_file> files;
  for (int r = 0; r < ranks; ++r) {
    const auto at = 2 * static_cast<std::size_t>(r);
    if (all[at] < 0)
      throw std::runtime_error(fmt::format("rank {} could not write its 1-bit error buffers of stage {}", r, stage));
    ckpt::checkpoint_file f;
    f.group = checkpoint_errors_group(stage, static_cast<std::uint32_t>(r));
    f.name = f.group + ".safetensors";
    f.bytes = static_cast<std::uint64_t>(all[at]);
    f.crc32c = static_cast<std::uint32_t>(all[at + 1]);
    files.push_back(std::move(f));
  }
  if (extra) files.push_back(std::move(*extra));
  return files;
}

} // namespace dsa::train
