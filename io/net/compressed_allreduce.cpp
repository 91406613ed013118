// The 1-bit compressed allreduce; see compressed_allreduce.hpp.
#include "io/net/compressed_allreduce.hpp"

#include "kernels/cpu/onebit.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace dsa::net {

std::int64_t onebit_padded(std::int64_t count, int ranks) {
  if (count <= 0) return 0;
  const std::int64_t n = std::max(ranks, 1);
  const std::int64_t unit = n * std::lcm<std::int64_t>(n, 8);
  return (count + unit - 1) / unit * unit;
}

expected<onebit_report> compressed_allreduce(communicator& comm, float* x, std::int64_t count, onebit_errors& errors) {
  const int n = comm.size();
  const std::int64_t padded = onebit_padded(count, n);
  if (padded == 0) {
    errors.worker.clear();
    errors.server.clear();
    return onebit_report{};
  }
  const std::int64_t part = padded / n, part_bytes = part / 8;
  if (errors.worker.empty() && errors.server.empty()) {
    errors.worker.assign(static_cast<std::size_t>(padded), 0.0f);
    errors.server.assign(static_cast<std::size_t>(part), 0.0f);
  }
  if (static_cast<std::int64_t>(errors.worker.size()) != padded || static_cast<std::int64_t>(errors.server.size()) != part)
    return make_error(errc::invalid_argument,
                      "compressed allreduce of {} elements over {} ranks: error buffers of {} and {} elements, "
                      "expected {} (worker) and {} (server)",
                      count, n, errors.worker.size(), errors.server.size(), padded, part);
  onebit_report report;
  const std::uint64_t sent_before = comm.transport_bytes_sent();
  // Phase 1: this rank's compensated signs, chunk p to rank p, and every rank's scale.
  std::vector<float> values(static_cast<std::size_t>(padded), 0.0f);
  std::memcpy(values.data(), x, static_cast<std::size_t>(count) * sizeof(float));
  std::vector<std::uint8_t> signs(static_cast<std::size_t>(padded / 8)), received(signs.size());
  report.worker_scale = cpu::onebit_compress(values.data(), errors.worker.data(), signs.data(), padded);
  DSA_TRY(comm.all_to_all(received.data(), signs.data(), dtype::u8, part_bytes));
  std::vector<float> scales(static_cast<std::size_t>(n));
  DSA_TRY(comm.allgather(scales.data(), &report.worker_scale, dtype::f32, n));
  // The server's chunk: the ranks' expansions summed in rank order, averaged, compensated.
  std::vector<float> average(static_cast<std::size_t>(part), 0.0f);
  for (int j = 0; j < n; ++j)
    cpu::onebit_accumulate(received.data() + j * part_bytes, scales[static_cast<std::size_t>(j)], average.data(), part);
  for (auto& v : average) v /= static_cast<float>(n);
  std::vector<std::uint8_t> server_signs(static_cast<std::size_t>(part_bytes));
  report.server_scale = cpu::onebit_compress(average.data(), errors.server.data(), server_signs.data(), part);
  // Phase 2: every server chunk to every rank.
  DSA_TRY(comm.allgather(signs.data(), server_signs.data(), dtype::u8, padded / 8));
  DSA_TRY(comm.allgather(scales.data(), &report.server_scale, dtype::f32, n));
  for (int r = 0; r < n; ++r)
    cpu::onebit_expand(signs.data() + r * part_bytes, scales[static_cast<std::size_t>(r)], values.data() + r * part, part);
  std::memcpy(x, values.data(), static_cast<std::size_t>(count) * sizeof(float));
  // Sent: (n-1) chunks in each phase, and (n-1) scales in each (the allgather's own
  // pattern may forward more; this is the algorithm's volume).
  report.bytes_sent = 2 * static_cast<std::uint64_t>(n - 1) * (static_cast<std::uint64_t>(part_bytes) + sizeof(float));
  report.wire_bytes = comm.transport_bytes_sent() - sent_before;
  return report;
}

} // namespace dsa::net
