// The slot table; see slot_table.hpp.
#include "actors/slot_table.hpp"

#include "core/error.hpp"

namespace dsa::actors {

std::uint32_t slot_table::add_edge(std::string name, std::uint32_t slots, std::uint32_t tensors_per_slot) {
  DSA_CHECK(slots > 0, "edge {} needs at least one slot", name);
  edges_.push_back({std::move(name), std::vector<slot_contents>(slots, slot_contents(tensors_per_slot))});
  return static_cast<std::uint32_t>(edges_.size() - 1);
}

slot_contents& slot_table::at(slot_ref ref) {
  DSA_CHECK(ref.edge < edges_.size() && ref.slot < edges_[ref.edge].slots.size(), "bad slot ref {{{}, {}}}",
            ref.edge, ref.slot);
  return edges_[ref.edge].slots[ref.slot];
}

const std::string& slot_table::edge_name(std::uint32_t edge) const {
  DSA_CHECK(edge < edges_.size(), "bad edge {}", edge);
  return edges_[edge].name;
}

std::uint32_t slot_table::slot_count(std::uint32_t edge) const {
  DSA_CHECK(edge < edges_.size(), "bad edge {}", edge);
  return static_cast<std::uint32_t>(edges_[edge].slots.size());
}

std::uint64_t slot_table::bytes(slot_ref ref) {
  std::uint64_t total = 0;
  for (const auto& t : at(ref))
    if (t.defined()) total += t.nbytes();
  return total;
}

} // namespace dsa::actors
