// Offsets, padding and partitions of a stage's flat parameter space.
#include "optim/flat_layout.hpp"

#include "optim/optimizer.hpp"

#include <algorithm>
#include <set>

namespace dsa::optim {
namespace {

std::int64_t round_up(std::int64_t x, std::int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

} // namespace

flat_tensor_spec bert_flat_tensor(std::string name, shape_t shape) {
  bool decay = !bert_no_decay(name);
  return {std::move(name), std::move(shape), decay};
}

expected<flat_layout> flat_layout::create(std::vector<flat_tensor_spec> specs, std::uint32_t ranks,
                                          std::int64_t alignment) {
  if (ranks < 1) return make_error(errc::invalid_argument, "flat layout: needs at least one rank, got {}", ranks);
  if (alignment < 1) return make_error(errc::invalid_argument, "flat layout: alignment must be >= 1, got {}", alignment);
  flat_layout layout;
  layout.ranks_ = ranks;
  layout.alignment_ = alignment;
  std::set<std::string> names;
  std::int64_t end = 0;
  for (auto& spec : specs) {
    const std::int64_t n = shape_numel(spec.shape);
    if (n <= 0)
      return make_error(errc::invalid_argument, "flat layout: parameter '{}' has shape {} and no elements", spec.name,
                        shape_string(spec.shape));
    if (!names.insert(spec.name).second)
      return make_error(errc::invalid_argument, "flat layout: parameter '{}' appears twice", spec.name);
    const std::int64_t offset = round_up(end, alignment);
    layout.tensors_.push_back({std::move(spec.name), std::move(spec.shape), spec.decay, n, offset});
    layout.numel_ += n;
    end = offset + n;
  }
  layout.padded_numel_ = std::max<std::int64_t>(round_up(end, static_cast<std::int64_t>(ranks) * alignment),
                                                static_cast<std::int64_t>(ranks) * alignment);
  return layout;
}

expected<flat_layout> flat_layout::with_ranks(std::uint32_t ranks) const {
  std::vector<flat_tensor_spec> specs;
  for (const auto& t : tensors_) specs.push_back({t.name, t.shape, t.decay});
  return create(std::move(specs), ranks, alignment_);
}

flat_range flat_layout::partition(std::uint32_t rank) const {
  DSA_CHECK(rank < ranks_, "flat layout: rank {} of {}", rank, ranks_);
  const std::int64_t size = partition_numel();
  return {rank * size, (rank + 1) * size};
}

std::vector<flat_piece> flat_layout::pieces(std::int64_t lo, std::int64_t hi) const {
  DSA_CHECK(0 <= lo && lo <= hi && hi <= padded_numel_, "flat layout: range [{}, {}) outside [0, {})", lo, hi,
            padded_numel_);
  std::vector<flat_piece> out;
  // The first tensor ending after lo.
  auto it = std::upper_bound(tensors_.begin(), tensors_.end(), lo,
                             [](std::int64_t x, const flat_tensor& t) { return x < t.offset + t.numel; });
  for (; it != tensors_.end() && it->offset < hi; ++it) {
    const std::int64_t begin = std::max(lo, it->offset), end = std::min(hi, it->offset + it->numel);
    if (begin < end)
      out.push_back({static_cast<std::size_t>(it - tensors_.begin()), begin - it->offset, begin, end - begin});
  }
  return out;
}

std::uint32_t flat_layout::first_owner(std::size_t tensor) const {
  return static_cast<std::uint32_t>(tensors_.at(tensor).offset / partition_numel());
}

std::uint32_t flat_layout::last_owner(std::size_t tensor) const {
  const flat_tensor& t = tensors_.at(tensor);
  return static_cast<std::uint32_t>((t.offset + t.numel - 1) / partition_numel());
}

std::optional<std::size_t> flat_layout::find(std::string_view name) const {
  for (std::size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].name == name) return i;
  return std::nullopt;
}

} // namespace dsa::optim
