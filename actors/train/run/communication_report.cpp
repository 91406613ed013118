// A data-parallel run's bytes on the wire; see communication_report.hpp.
#include "actors/train/run/communication_report.hpp"

#include "io/ckpt/atomic_file.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace dsa::train {
namespace {

double mib(std::uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }
double ratio(std::uint64_t num, std::uint64_t den) { return den > 0 ? static_cast<double>(num) / static_cast<double>(den) : 0.0; }

} // namespace

communication_figures communication_of(const std::string& optimizer, int ranks, std::int64_t steps,
                                       const std::vector<const model_shard*>& shards,
                                       std::int64_t parameters, std::uint64_t bytes_sent) {
  communication_figures f;
  f.optimizer = optimizer;
  f.ranks = ranks;
  f.steps = steps;
  f.parameters = parameters;
  f.bytes_sent = bytes_sent;
  f.fp16_allreduce_bytes =
      static_cast<std::uint64_t>(fp16_ring_allreduce_bytes(static_cast<double>(parameters), ranks) * static_cast<double>(steps));
  for (const auto* shard : shards)
    if (const compressed_traffic* t = shard->traffic()) {
      f.local_steps = std::max(f.local_steps, t->local_steps); // every stage's shard keeps the same steps local
      f.exchanges += t->exchanges;
      f.local_exchange_bytes += t->wire_bytes;
      f.local_fp16_allreduce_bytes += t->local_fp16_bytes;
    }
  return f;
}

std::string describe(const communication_figures& f) {
  std::string line = fmt::format(
      "communication: this rank sent {:.2f} MiB over {} steps; an fp16 ring allreduce of the gradients ({} parameters, "
      "{} ranks) would have sent {:.2f} MiB ({:.2f}x)",
      mib(f.bytes_sent), f.steps, f.parameters, f.ranks, mib(f.fp16_allreduce_bytes),
      ratio(f.fp16_allreduce_bytes, f.bytes_sent));
  if (f.exchanges > 0 || f.local_steps > 0)
    line += fmt::format("; compressed communication: {} of the steps kept their gradients local and ran {} 1-bit "
                        "exchanges, {:.2f} MiB on the wire against {:.2f} MiB of fp16 allreduce ({:.2f}x)",
                        f.local_steps, f.exchanges, mib(f.local_exchange_bytes), mib(f.local_fp16_allreduce_bytes),
                        ratio(f.local_fp16_allreduce_bytes, f.local_exchange_bytes));
  if (f.shared_memory_allreduce)
    line += "; the in-process ranks' gradient allreduces went through shared memory and are not counted "
            "(devices.shared_memory_allreduce = false sends them over the transport)";
  return line;
}

status write_communication(const std::string& run_dir, const communication_figures& f) {
  nlohmann::json j;
  j["optimizer"] = f.optimizer;
  j["ranks"] = f.ranks;
  j["steps"] = f.steps;
  j["parameters"] = f.parameters;
  j["bytes_sent"] = f.bytes_sent;
  j["fp16_allreduce_bytes"] = f.fp16_allreduce_bytes;
  j["wire_ratio"] = ratio(f.fp16_allreduce_bytes, f.bytes_sent);
  j["local_steps"] = f.local_steps;
  j["exchanges"] = f.exchanges;
  j["local_exchange_bytes"] = f.local_exchange_bytes;
  j["local_fp16_allreduce_bytes"] = f.local_fp16_allreduce_bytes;
  j["local_wire_ratio"] = ratio(f.local_fp16_allreduce_bytes, f.local_exchange_bytes);
  j["shared_memory_allreduce_uncounted"] = f.shared_memory_allreduce;
  return ckpt::write_file_atomic(run_dir + "/communication.json", j.dump() + "\n");
}

} // namespace dsa::train
