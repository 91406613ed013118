// A partitioned shard's checkpoints, in per-rank form; see partition_shard.hpp and
// model_shard.hpp.
#include "actors/train/shard/partition_shard.hpp"

#include "actors/data_parallel.hpp"
#include "actors/train/shard/shard_checkpoint.hpp"
#include "io/aio/swap_store.hpp"
#include "optim/partition_checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

namespace dsa::train {
state_payload partition_shard::payload() const {
  DSA_CHECK(false, "optimizer shard {}: a partitioned shard checkpoints per rank (gathered_masters, stage_partition)",
            options_.participant);
  return {};
}

std::vector<ckpt::checkpoint_file> partition_shard::stage_errors(const std::string& root, std::uint64_t step) const {
  DSA_CHECK(saves_errors(), "optimizer shard {}: stage_errors without a compressed optimizer over several ranks",
            options_.participant);
  std::string failure;
  // 1-bit LAMB over ZeRO: its coefficients, factors, scalings and (gathered whole) fresh
  // variance, the same on every rank, in one group that rank 0 writes.
  std::optional<ckpt::checkpoint_file> lamb_file;
  if (options_.optimizer.type == optim::optimizer_type::onebit_lamb) {
    const std::vector<float>& fresh = part_->lamb_fresh();
    std::vector<float> whole;
    if (part_->compressed_next()) { // frozen on every rank or on none
      whole.resize(static_cast<std::size_t>(part_->layout().padded_numel()));
      if (auto g = actors::log_collective(options_.logger, "all_gather", static_cast<std::int64_t>(whole.size()) * 4,
                                          shard_name(), [&] {
                                            return options_.peers->allgather(whole.data(), fresh.data(), dtype::f32,
                                                                             static_cast<std::int64_t>(whole.size()));
                                          });
          !g)
        throw std::runtime_error(fmt::format("gathering stage {}'s 1-bit LAMB fresh variance: {}", options_.participant,
                                             g.err().message));
    }
    if (options_.peers->rank() == 0) {
      const auto staged = ckpt::stage_group(root, step, checkpoint_lamb_group(options_.participant),
                                            part_->lamb_state(whole.empty() ? nullptr : whole.data()));
      if (staged) lamb_file = *staged;
      else failure = staged.err().message;
    }
  }
  return stage_error_files(options_, shard_name(), root, step, zchannel_->error_tensors(), std::move(failure),
                           std::move(lamb_file));
}

ckpt::checkpoint_file partition_shard::stage_masters(const std::string& root, std::uint64_t step) const {
  DSA_CHECK(streams_masters(), "optimizer shard {}: stage_masters without a swapped state on one rank",
            options_.participant);
  const auto& layout = part_->layout();
  std::map<std::string, ckpt::tensor_spec> specs;
  std::map<std::string, const optim::flat_tensor*> by_name;
  for (const auto& t : layout.tensors()) {
    specs[t.name] = ckpt::tensor_spec{t.shape, dtype::f32};
    by_name[t.name] = &t;
  }
  const std::int64_t lo = part_->partition().lo; // 0: one rank's partition is the stage
  auto staged = ckpt::stage_group_streamed(root, step, "model", specs,
                                           [&](const std::string& name, const ckpt::tensor_spec& s) -> expected<tensor> {
                                             const optim::flat_tensor& t = *by_name.at(name);
                                             tensor out = tensor::empty(s.shape, dtype::f32);
                                             DSA_TRY(swap_->read_range(optim::master_array, t.offset - lo, t.numel,
                                                                       out.data<float>()));
                                             return out;
                                           });
  if (!staged)
    throw std::runtime_error(fmt::format("writing stage {}'s master weights from NVMe for a checkpoint: {}",
                                         options_.participant, staged.err().message));
  return *staged;
}

state_payload partition_shard::gathered_masters() const {
  DSA_CHECK(part_.has_value(), "optimizer shard {}: gathered_masters before init", options_.participant);
  if (streams_masters()) return {}; // stage_masters writes the model file
  auto read = part_->read_state(optim::array_bit(optim::master_array));
  // Every rank learns whether every rank could read its masters before any data moves: a
  // rank that failed still joins, so the others fail with it instead of waiting.
  const auto all_ok = gather_entries(options_, shard_name(), {read ? 1 : 0}, "master weights");
  if (!read)
    throw std::runtime_error(fmt::format("reading stage {}'s master weights for a checkpoint: {}",
                                         options_.participant, read.err().message));
  for (std::uint32_t r = 0; r < options_.zero_ranks; ++r)
    if (all_ok[r] == 0)
      throw std::runtime_error(fmt::format("rank {} could not read its master weights of stage {} for a checkpoint",
                                           r, options_.participant));
  const auto& layout = part_->layout();
  tensor all = read->master; // one rank: its partition is the whole stage
  if (options_.zero_ranks > 1) {
    // Only rank 0 writes the model file: it receives every partition into the whole
    // stage; the others pass the partitions on through one partition-sized buffer (the
    // broadcasts' tree), never holding the whole stage.
    const std::int64_t P = layout.partition_numel();
    const bool root = options_.zero_rank == 0;
    all = tensor::empty({root ? layout.padded_numel() : P}, dtype::f32);
    for (std::uint32_t r = 0; r < options_.zero_ranks; ++r) {
      tensor piece = root ? all.slice_rows(r * P, (r + 1) * P) : all;
      if (r == options_.zero_rank) piece.copy_from(read->master);
      if (auto b = actors::log_collective(options_.logger, "broadcast", P * 4, shard_name(),
                                          [&] { return options_.peers->broadcast(piece.raw_data(), dtype::f32, P,
                                                                                 static_cast<int>(r)); });
          !b)
        throw std::runtime_error(fmt::format("gathering stage {}'s master weights for a checkpoint from rank {}: {}",
                                             options_.participant, r, b.err().message));
    }
    if (!root) return {};
  }
  state_payload p;
  for (const auto& t : layout.tensors()) p["master." + t.name] = layout_view(all, t);
  return p;
}

std::vector<ckpt::checkpoint_file> partition_shard::stage_partition(const std::string& root, std::uint64_t step) const {
  DSA_CHECK(part_.has_value(), "optimizer shard {}: stage_partition before init", options_.participant);
  // One file per store chunk (one in memory: the whole partition in one file), written while
  // the chunk is at hand, so swapped state is never read back whole. Every rank has as many
  // chunks (the same partition size and sub-group size).
  const std::int64_t parts = part_->store().chunks();
  const auto stage = options_.participant, rank = options_.zero_rank;
  std::vector<std::int64_t> mine(2 * static_cast<std::size_t>(parts), -1);
  const unsigned moments = optim::array_bit(optim::exp_avg_array) | optim::array_bit(optim::exp_avg_sq_array);
  status written = optim::partition_payload_chunks(*part_, moments, [&](std::int64_t k, optim::state_map pieces) -> status {
    ckpt::named_tensors tensors(pieces.begin(), pieces.end());
    DSA_ASSIGN_OR_RETURN(auto f, ckpt::stage_group(root, step, checkpoint_partition_group(stage, rank, k, parts), tensors));
    mine[2 * static_cast<std::size_t>(k)] = static_cast<std::int64_t>(f.bytes);
    mine[2 * static_cast<std::size_t>(k) + 1] = static_cast<std::int64_t>(f.crc32c);
    return {};
  });
  // A rank that failed still joins the gather (its entries -1), so every rank fails instead
  // of waiting for it; the gather is also the barrier: every file exists when it returns.
  if (!written) std::fill(mine.begin(), mine.end(), -1);
  const auto all = gather_entries(options_, shard_name(), mine, "checkpoint files");
  if (!written)
    throw std::runtime_error(fmt::format("writing stage {}'s optimizer partition: {}", stage, written.err().message));
  std::vector<ckpt::checkpoint_file> files;
  for (std::uint32_t r = 0; r < options_.zero_ranks; ++r)
    for (std::int64_t k = 0; k < parts; ++k) {
      const std::size_t at = 2 * (r * static_cast<std::size_t>(parts) + static_cast<std::size_t>(k));
      if (all[at] < 0)
        throw std::runtime_error(fmt::format("rank {} could not write its partition of stage {}'s optimizer state", r,
                                             stage));
      ckpt::checkpoint_file f;
      f.group = checkpoint_partition_group(stage, r, k, parts);
      f.name = f.group + ".safetensors";
      f.bytes = static_cast<std::uint64_t>(all[at]);
      f.crc32c = static_cast<std::uint32_t>(all[at + 1]);
      files.push_back(std::move(f));
    }
  return files;
}

} // namespace dsa::train
