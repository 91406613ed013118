// One stage's optimizer shard: its checkpoints (the whole state of a shard that is not
// partitioned; the per-rank form of a partitioned one). See bert_optimizer.hpp.
#include "actors/train/shard/bert_optimizer.hpp"

#include "actors/data_parallel.hpp"
#include "optim/partition_checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

namespace dsa::train {
namespace {
// Tensor i of the layout as a view of a flat buffer, in its own shape.
tensor layout_view(const tensor& flat, const optim::flat_tensor& t) {
  return flat.slice_rows(t.offset, t.offset + t.numel).reshape(t.shape);
}
} // namespace

std::string checkpoint_partition_group(std::uint32_t stage, std::uint32_t rank, std::int64_t part, std::int64_t parts) {
  return parts <= 1 ? fmt::format("optimizer_{}_rank{}", stage, rank)
                    : fmt::format("optimizer_{}_rank{}_part{}", stage, rank, part);
}

std::string checkpoint_lamb_group(std::uint32_t stage) { return fmt::format("onebit_lamb_{}", stage); }

std::string checkpoint_errors_group(std::uint32_t stage, std::uint32_t rank) {
  return fmt::format("onebit_errors_{}_rank{}", stage, rank);
}

std::vector<ckpt::checkpoint_file> bert_optimizer::stage_errors(const std::string& root, std::uint64_t step) const {
  DSA_CHECK(saves_errors(), "optimizer shard {}: stage_errors without a compressed optimizer over several ranks",
            options_.participant);
  const auto stage = options_.participant;
  const int ranks = options_.peers->size();
  std::vector<std::int64_t> mine{-1, -1};
  std::string failure;
  // 1-bit LAMB over ZeRO: its coefficients, factors, scalings and (gathered whole) fresh
  // variance, the same on every rank, in one group that rank 0 writes.
  std::optional<ckpt::checkpoint_file> lamb_file;
  if (zchannel_ && options_.optimizer.type == optim::optimizer_type::onebit_lamb) {
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
        throw std::runtime_error(fmt::format("gathering stage {}'s 1-bit LAMB fresh variance: {}", stage,
                                             g.err().message));
    }
    if (options_.peers->rank() == 0) {
      const auto staged = ckpt::stage_group(root, step, checkpoint_lamb_group(stage),
                                            part_->lamb_state(whole.empty() ? nullptr : whole.data()));
      if (staged) lamb_file = *staged;
      else failure = staged.err().message;
    }
  }
  if (failure.empty()) {
    const auto staged = ckpt::stage_group(root, step, checkpoint_errors_group(stage, static_cast<std::uint32_t>(options_.peers->rank())),
                                          comp_ ? comp_->error_tensors() : zchannel_->error_tensors());
    if (staged) mine = {static_cast<std::int64_t>(staged->bytes), static_cast<std::int64_t>(staged->crc32c)};
    else failure = staged.err().message;
  }
  // Every rank joins the gather (-1 for a failed write), so all fail together; it is also
  // the barrier: every file exists when it returns.
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(ranks));
  if (auto g = actors::log_collective(options_.logger, "all_gather", static_cast<std::int64_t>(all.size()) * 8, shard_name(),
                                      [&] { return options_.peers->allgather(all.data(), mine.data(), dtype::i64,
                                                                             static_cast<std::int64_t>(all.size())); });
      !g)
    throw std::runtime_error(fmt::format("gathering stage {}'s error-buffer files from the other ranks: {}", stage,
                                         g.err().message));
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
  if (lamb_file) files.push_back(std::move(*lamb_file));
  return files;
}

std::vector<std::int64_t> bert_optimizer::gather_entries(const std::vector<std::int64_t>& mine, const char* what) const {
  if (options_.zero_ranks == 1) return mine;
  std::vector<std::int64_t> all(mine.size() * options_.zero_ranks);
  // count: the whole output, every rank's share of it one after the other.
  if (auto g = actors::log_collective(options_.logger, "all_gather", static_cast<std::int64_t>(all.size()) * 8, shard_name(),
                                      [&] {
                                        return options_.peers->allgather(all.data(), mine.data(), dtype::i64,
                                                                         static_cast<std::int64_t>(all.size()));
                                      });
      !g)
    throw std::runtime_error(fmt::format("gathering stage {}'s {} from the other ranks: {}", options_.participant, what,
                                         g.err().message));
  return all;
}

ckpt::checkpoint_file bert_optimizer::stage_masters(const std::string& root, std::uint64_t step) const {
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

state_payload bert_optimizer::gathered_masters() const {
  DSA_CHECK(per_rank_checkpoint(), "optimizer shard {}: gathered_masters without ZeRO ranks or offload",
            options_.participant);
  if (streams_masters()) return {}; // stage_masters writes the model file
  auto read = part_->read_state(optim::array_bit(optim::master_array));
  // Every rank learns whether every rank could read its masters before any data moves: a
  // rank that failed still joins, so the others fail with it instead of waiting.
  const auto all_ok = gather_entries({read ? 1 : 0}, "master weights");
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

std::vector<ckpt::checkpoint_file> bert_optimizer::stage_partition(const std::string& root, std::uint64_t step) const {
  DSA_CHECK(per_rank_checkpoint(), "optimizer shard {}: stage_partition without ZeRO ranks or offload",
            options_.participant);
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
  const auto all = gather_entries(mine, "checkpoint files");
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

state_payload bert_optimizer::payload() const {
  DSA_CHECK(!part_, "optimizer shard {}: a partitioned shard checkpoints per rank (gathered_masters, stage_partition)",
            options_.participant);
  state_payload p;
  for (const auto& s : slots_) p["master." + s.name] = s.param; // views: no copy of the shard's state
  optim::optimizer_state st;
  if (comp_) {
    st.tensors = comp_->state_tensors(); // copies: the moments live in the optimizers' vectors
    st.step = comp_->step_count();
  } else {
    st = opt_->state_views();
  }
  for (auto& [name, t] : st.tensors) p[name] = std::move(t);
  tensor count = tensor::empty({1}, dtype::i64);
  count.data<std::int64_t>()[0] = st.step;
  p["optimizer_step_count"] = count;
  return p;
}

} // namespace dsa::train
