// The per-process table that resolves slot references {edge, slot} to
// memory. Edges and slot counts are fixed before actors start; afterwards the
// table's shape never changes, so lookups need no lock. A slot's contents are
// written by its producer before `produced` is sent and read by its consumer
// after it arrives; the message is the synchronisation.
#pragma once

#include "actors/protocol/messages.hpp"
#include "core/tensor.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::actors {

using slot_contents = std::vector<tensor>;

class slot_table {
public:
  // Returns the new edge's id.
  std::uint32_t add_edge(std::string name, std::uint32_t slots, std::uint32_t tensors_per_slot);

  slot_contents& at(slot_ref ref);
  const std::string& edge_name(std::uint32_t edge) const;
  std::uint32_t slot_count(std::uint32_t edge) const;
  std::uint32_t edge_count() const { return static_cast<std::uint32_t>(edges_.size()); }
  // Bytes held by the slot's tensors (for messages and the trace).
  std::uint64_t bytes(slot_ref ref);

private:
  struct edge {
    std::string name;
    std::vector<slot_contents> slots;
  };
  std::vector<edge> edges_;
};

} // namespace dsa::actors
