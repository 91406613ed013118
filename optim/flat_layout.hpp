// A pipeline stage's parameters laid end to end in one flat index space, split
// evenly over the data-parallel ranks: ZeRO-1/2 partitioning arithmetic.
//
// Each tensor starts at a multiple of `alignment` elements (in the stage's
// parameter order), and the total is padded to a multiple of ranks x alignment,
// so every rank owns the same number of elements and every partition boundary
// falls on a multiple of `alignment` inside any tensor. DeepSpeed pads only the
// end of each group's flat buffer (to ranks x a 4-byte alignment factor) and lets
// boundaries fall anywhere; aligning each tensor as well costs under `alignment`
// elements per tensor and buys: LAMB's norm blocks never straddle two ranks, so
// the trust ratio of a tensor split over ranks is bit-identical to the whole
// tensor's (partitioned_optimizer.hpp); each tensor's data starts 8 KiB-aligned
// in f32 (4 KiB in f16), as O_DIRECT swapping of sub-ranges will need; and the
// tensor offsets do not depend on the rank count, so a checkpoint repartitions
// by plain element ranges. Padding elements hold zeros and take no part in any
// update or norm.
#pragma once

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "kernels/cpu/lamb.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsa::optim {

// One parameter as the layout needs it.
struct flat_tensor_spec {
  std::string name; // HuggingFace name
  shape_t shape;
  bool decay = true; // weight decay applies (false for bert_no_decay names)
};
// The spec of a BERT parameter: decay unless bert_no_decay(name).
flat_tensor_spec bert_flat_tensor(std::string name, shape_t shape);

struct flat_tensor {
  std::string name;
  shape_t shape;
  bool decay = true;
  std::int64_t numel = 0;
  std::int64_t offset = 0; // first flat element, a multiple of the alignment
};

// Flat elements [lo, hi).
struct flat_range {
  std::int64_t lo = 0;
  std::int64_t hi = 0;
  std::int64_t size() const { return hi - lo; }
};

// Elements [tensor_offset, tensor_offset + count) of tensors()[tensor] (row-major order),
// which sit at flat elements [flat_offset, flat_offset + count).
struct flat_piece {
  std::size_t tensor = 0;
  std::int64_t tensor_offset = 0;
  std::int64_t flat_offset = 0;
  std::int64_t count = 0;
};

class flat_layout {
public:
  // LAMB over partitions needs alignment to be a multiple of the kernel's norm block.
  static constexpr std::int64_t default_alignment = cpu::lamb_norm_block; // 2048 elements

  // specs in the stage's parameter order; every tensor non-empty, names unique;
  // ranks >= 1; alignment >= 1 elements.
  static expected<flat_layout> create(std::vector<flat_tensor_spec> specs, std::uint32_t ranks,
                                      std::int64_t alignment = default_alignment);
  // The same tensors at the same offsets for another rank count (only the end padding changes).
  expected<flat_layout> with_ranks(std::uint32_t ranks) const;

  std::uint32_t ranks() const { return ranks_; }
  std::int64_t alignment() const { return alignment_; }
  const std::vector<flat_tensor>& tensors() const { return tensors_; }
  std::int64_t numel() const { return numel_; }               // elements of the tensors, no padding
  std::int64_t padded_numel() const { return padded_numel_; } // a multiple of ranks x alignment
  std::int64_t partition_numel() const { return padded_numel_ / ranks_; }

  // The elements rank owns: [rank x partition_numel, (rank + 1) x partition_numel).
  flat_range partition(std::uint32_t rank) const;
  // The tensor pieces inside flat [lo, hi), in flat order (padding left out).
  std::vector<flat_piece> pieces(std::int64_t lo, std::int64_t hi) const;
  std::vector<flat_piece> pieces(const flat_range& r) const { return pieces(r.lo, r.hi); }
  // The first and last rank holding elements of tensors()[tensor].
  std::uint32_t first_owner(std::size_t tensor) const;
  std::uint32_t last_owner(std::size_t tensor) const;
  bool spans_ranks(std::size_t tensor) const { return first_owner(tensor) != last_owner(tensor); }
  std::optional<std::size_t> find(std::string_view name) const;

private:
  flat_layout() = default;

  std::vector<flat_tensor> tensors_;
  std::uint32_t ranks_ = 1;
  std::int64_t alignment_ = 1;
  std::int64_t numel_ = 0;
  std::int64_t padded_numel_ = 0;
};

} // namespace dsa::optim
