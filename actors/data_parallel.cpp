// Bucketed gradient sums across data-parallel ranks; see data_parallel.hpp.
#include "actors/data_parallel.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace dsa::actors {

namespace {
template <class F>
auto logged(net::comms_logger* logger, std::string_view op, std::int64_t bytes, std::string_view caller, F&& call) {
  return log_collective(logger, op, bytes, caller, std::forward<F>(call));
}
} // namespace

status allreduce_buffers(net::communicator& comm, std::vector<tensor>& buffers, std::int64_t bucket_elements,
                         net::comms_logger* logger, std::string_view caller) {
  const std::int64_t limit = std::max<std::int64_t>(bucket_elements, 1);
  for (const tensor& b : buffers)
    if (!b.defined() || b.type() != dtype::f32 || !b.is_contiguous())
      return make_error(errc::invalid_argument, "allreduce_buffers: buffer {} is not a contiguous f32 tensor",
                        b.defined() ? b.describe() : "(none)");
  std::vector<float> scratch;
  std::size_t i = 0;
  while (i < buffers.size()) {
    // The bucket [i, j): as many consecutive tensors as fit, at least one.
    std::size_t j = i + 1;
    std::int64_t elements = buffers[i].numel();
    while (j < buffers.size() && elements + buffers[j].numel() <= limit) elements += buffers[j++].numel();
    if (j == i + 1) {
      DSA_TRY(logged(logger, "all_reduce", elements * 4, caller,
                     [&] { return comm.allreduce_sum(buffers[i].raw_data(), dtype::f32, elements); }));
    } else {
      scratch.resize(static_cast<std::size_t>(elements));
      std::int64_t at = 0;
      for (std::size_t k = i; k < j; ++k) {
        std::memcpy(scratch.data() + at, buffers[k].raw_data(), static_cast<std::size_t>(buffers[k].numel()) * 4);
        at += buffers[k].numel();
      }
      DSA_TRY(logged(logger, "all_reduce", elements * 4, caller,
                     [&] { return comm.allreduce_sum(scratch.data(), dtype::f32, elements); }));
      at = 0;
      for (std::size_t k = i; k < j; ++k) {
        std::memcpy(buffers[k].raw_data(), scratch.data() + at, static_cast<std::size_t>(buffers[k].numel()) * 4);
        at += buffers[k].numel();
      }
    }
    i = j;
  }
  return {};
}

expected<std::vector<double>> sum_over_ranks(net::communicator& comm, const std::vector<double>& values,
                                             net::comms_logger* logger, std::string_view caller) {
  static_assert(sizeof(double) == sizeof(std::int64_t));
  const auto n = static_cast<std::int64_t>(values.size());
  std::vector<double> all(values.size() * static_cast<std::size_t>(comm.size()));
  // Each rank's part of the allgather is exactly its n values (n * size elements in all).
  DSA_TRY(logged(logger, "all_gather", n * comm.size() * 8, caller,
                 [&] { return comm.allgather(all.data(), values.data(), dtype::i64, n * comm.size()); }));
  std::vector<double> sum(values.size(), 0.0);
  for (int r = 0; r < comm.size(); ++r)
    for (std::size_t i = 0; i < values.size(); ++i) sum[i] += all[static_cast<std::size_t>(r) * values.size() + i];
  return sum;
}

expected<bool> any_rank(net::communicator& comm, bool mine, net::comms_logger* logger, std::string_view caller) {
  const std::uint8_t flag = mine ? 1 : 0;
  std::vector<std::uint8_t> all(static_cast<std::size_t>(comm.size()));
  DSA_TRY(logged(logger, "all_gather", comm.size(), caller,
                 [&] { return comm.allgather(all.data(), &flag, dtype::u8, comm.size()); }));
  return std::any_of(all.begin(), all.end(), [](std::uint8_t f) { return f != 0; });
}

} // namespace dsa::actors
