// What the processes of a job must do alike after each planned its own host memory; see
// memory_plan.hpp (agree_on_memory).
#include "actors/train/memory/memory_plan.hpp"

#include "core/log.hpp"
#include "io/net/rendezvous_client.hpp"

#include <algorithm>
#include <string>

namespace dsa::train {

namespace {
net::bytes text_bytes(const std::string& s) {
  net::bytes out(s.size());
  std::transform(s.begin(), s.end(), out.begin(), [](char c) { return static_cast<std::byte>(c); });
  return out;
}

std::string bytes_text(const net::bytes& b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }

// Whether any process answered "1".
expected<bool> any_says(net::rendezvous_client& client, const char* key, bool mine) {
  DSA_ASSIGN_OR_RETURN(auto all, client.allgather(key, text_bytes(mine ? "1" : "0")));
  return std::any_of(all.begin(), all.end(), [](const net::bytes& b) { return bytes_text(b) == "1"; });
}
} // namespace

status agree_on_memory(net::rendezvous_client& client, run_config& rc, bool could_move_weights, bool& evaluates) {
  if (could_move_weights) {
    // A process whose budget needed the weights on NVMe: every process puts them there, so
    // the ranks' ZeRO-3 partitions live alike.
    DSA_ASSIGN_OR_RETURN(const bool any, any_says(client, "weights_to_nvme", rc.offload.param.swaps()));
    if (any && !rc.offload.param.swaps()) {
      log_info("host memory: zero_optimization.offload_param.device -> \"nvme\" (nvme_path {}, max_in_cpu 0): "
               "another process's budget needed it", rc.offload.nvme_path);
      weights_to_nvme(rc, rc.offload.param.buffer_size);
    }
  }
  if (rc.offload.swaps()) {
    // Each process fitted sub_group_size to its own measured baseline; the ranks' swap
    // chunks must match (a checkpoint pairs them up): every process takes the smallest,
    // whose buffers fit every process's plan.
    DSA_ASSIGN_OR_RETURN(auto chosen, client.allgather("sub_group_size", text_bytes(std::to_string(rc.offload.sub_group_size))));
    std::int64_t smallest = rc.offload.sub_group_size;
    for (const auto& b : chosen) smallest = std::min<std::int64_t>(smallest, std::stoll(bytes_text(b)));
    if (smallest != rc.offload.sub_group_size) {
      log_info("host memory: zero_optimization.sub_group_size {} -> {}: another process's budget needed it",
               rc.offload.sub_group_size, smallest);
      rc.offload.sub_group_size = smallest;
    }
  }
  if (rc.host_memory > 0) {
    // The final evaluation under a budget: only if every process's plan has room for it
    // (the ZeRO-3 gather before it is a collective, so they must agree).
    DSA_ASSIGN_OR_RETURN(const bool any_short, any_says(client, "evaluates", !evaluates));
    evaluates = evaluates && !any_short;
  }
  return {};
}

} // namespace dsa::train
