// What a data-parallel run sent over its transport, against what plain fp16 ring allreduce
// of its gradients would have sent (2 (n - 1) / n x 2 bytes per parameter per step), with
// the compressed optimizers' own figures: the end-of-run log line and communication.json in
// the run folder (read by `dsactor bench compressed`).
#pragma once

#include "actors/train/shard/model_shard.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::train {

struct communication_figures {
  std::string optimizer;
  int ranks = 1;
  std::int64_t steps = 0, parameters = 0;
  std::uint64_t bytes_sent = 0;            // the transport's count for this rank, whole run
  std::uint64_t fp16_allreduce_bytes = 0;  // the fp16 ring allreduce of every step's gradients
  // Compressed optimizers (summed over the rank's stages): the steps whose gradients stayed
  // local, the 1-bit exchanges, the transport's count during them, and the fp16 allreduce
  // bytes of those steps' gradients.
  std::int64_t local_steps = 0, exchanges = 0;
  std::uint64_t local_exchange_bytes = 0, local_fp16_allreduce_bytes = 0;
  // In-process ranks summed their gradients through shared memory (devices.
  // shared_memory_allreduce), which the transport does not count: bytes_sent leaves it out.
  bool shared_memory_allreduce = false;
};

// shards: one rank's; bytes_sent: its transport's count over the run.
communication_figures communication_of(const std::string& optimizer, int ranks, std::int64_t steps,
                                       const std::vector<const model_shard*>& shards,
                                       std::int64_t parameters, std::uint64_t bytes_sent);
// The log line ("communication: ...").
std::string describe(const communication_figures& f);
// communication.json (one JSON object), written atomically into run_dir.
status write_communication(const std::string& run_dir, const communication_figures& f);

} // namespace dsa::train
