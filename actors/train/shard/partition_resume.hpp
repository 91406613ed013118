// A ZeRO resume that reads only its own partition: readers over a checkpoint's files for
// one stage's optimizer state, handed to optim::saved_partitions, which then reads from
// each saved piece only the elements that fall into the rank's new partition.
//
// The sources are the stage's per-rank groups (optimizer_<s>_rank<r>[_part<k>]), or its
// whole-tensor group optimizer_<s> (a ZeRO-0 checkpoint) when there is one, plus the fp32
// masters from model.safetensors under "master.<name>" (the masters are gathered whole at
// save). Each file is opened once: its header is read and validated and its size checked
// against the manifest; tensor data is read by range on demand. The whole-file CRC32C of
// these files is not checked (that would read the whole stage); see docs/architecture.md.
// The same sources can be built over groups already in memory (memory_source), which is
// how optimizer_state_of assembles whole moments from a loaded checkpoint.
#pragma once

#include "io/ckpt/checkpoint_manifest.hpp"
#include "io/ckpt/safetensors_reader.hpp"
#include "optim/partition_checkpoint.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace dsa::train {

// The tensors of one group by name: a file read on demand, or tensors in memory.
struct tensor_source {
  std::vector<std::string> names;
  std::function<expected<shape_t>(const std::string&)> shape;
  std::function<expected<tensor>(const std::string&)> read;
  std::function<expected<tensor>(const std::string&, std::int64_t lo, std::int64_t hi)> read_range; // 1-D
};
tensor_source file_source(std::shared_ptr<const ckpt::safetensors_reader> reader);
// `where` names the group in errors.
tensor_source memory_source(const ckpt::named_tensors& tensors, const std::string& where);

// Stage `stage`'s saved_partitions from its optimizer groups (per-rank pieces, or one
// whole-tensor group when `whole_group`) and the masters of `model`. Errors start with `where`.
expected<std::vector<optim::saved_partition>> stage_partitions(const std::vector<tensor_source>& optimizer,
                                                               const tensor_source& model, bool whole_group,
                                                               std::uint32_t stage, const std::string& where);

struct stage_sources {
  std::vector<optim::saved_partition> parts;
  std::vector<std::shared_ptr<ckpt::safetensors_reader>> readers; // every file opened, the model file last
  // Tensor data bytes read so far through the readers.
  std::uint64_t bytes_read() const;
};

// The sources of stage `stage`'s optimizer state in checkpoint directory `dir`.
// Errors name `dir`, the file and the tensor at fault.
expected<stage_sources> open_stage_sources(const std::string& dir, const ckpt::checkpoint_manifest& manifest,
                                           std::uint32_t stage);

// The sources of a stage on another pipeline layout (other stage count or split): the
// tensors `names` (the new stage's parameters), each from the first of the saved stages
// 0 .. saved_stages - 1 that held it (a tied weight's copies agree). Errors name `dir`; a
// name no saved stage held is an error naming it.
expected<stage_sources> open_repartitioned_sources(const std::string& dir, const ckpt::checkpoint_manifest& manifest,
                                                   std::uint32_t saved_stages, const std::set<std::string>& names);

} // namespace dsa::train
