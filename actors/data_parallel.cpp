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

status allreduce_buffers(net::async_collectives& group, std::vector<tensor>& buffers, std::int64_t bucket_elements) {
  DSA_CHECK(group.memory() == net::buffer_memory::host, "allreduce_buffers: host tensors for a group of device buffers");
  const std::int64_t limit = std::max<std::int64_t>(bucket_elements, 1);
  for (const tensor& b : buffers)
    if (!b.defined() || b.type() != dtype::f32 || !b.is_contiguous())
      return make_error(errc::invalid_argument, "allreduce_buffers: buffer {} is not a contiguous f32 tensor",
                        b.defined() ? b.describe() : "(none)");
  // The buckets [first, last): as many consecutive tensors as fit, at least one; a bucket of
  // several is packed into scratch, all of it made before the first enqueue (a buffer belongs
  // to the group until the wait, so nothing may fail and unwind in between).
  struct bucket {
    std::size_t first, last;
    std::int64_t elements;
    std::vector<float> scratch;
  };
  std::vector<bucket> buckets;
  for (std::size_t i = 0; i < buffers.size();) {
    std::size_t j = i + 1;
    std::int64_t elements = buffers[i].numel();
    while (j < buffers.size() && elements + buffers[j].numel() <= limit) elements += buffers[j++].numel();
    buckets.push_back({i, j, elements, {}});
    i = j;
  }
  for (bucket& b : buckets) {
    if (b.last == b.first + 1) continue;
    b.scratch.resize(static_cast<std::size_t>(b.elements));
    std::int64_t at = 0;
    for (std::size_t k = b.first; k < b.last; ++k) {
      std::memcpy(b.scratch.data() + at, buffers[k].raw_data(), static_cast<std::size_t>(buffers[k].numel()) * 4);
      at += buffers[k].numel();
    }
  }
  net::async_collectives::ticket last = 0;
  for (bucket& b : buckets) {
    void* data = b.scratch.empty() ? buffers[b.first].raw_data() : static_cast<void*>(b.scratch.data());
    auto t = group.all_reduce_sum(data, dtype::f32, b.elements);
    if (!t) { // refused: what was enqueued before still reads these buffers until it ends
      if (last != 0) (void)group.wait(last);
      return t.err();
    }
    last = *t;
  }
  if (last != 0) DSA_TRY(group.wait(last));
  for (const bucket& b : buckets) {
    if (b.scratch.empty()) continue;
    std::int64_t at = 0;
    for (std::size_t k = b.first; k < b.last; ++k) {
      std::memcpy(buffers[k].raw_data(), b.scratch.data() + at, static_cast<std::size_t>(buffers[k].numel()) * 4);
      at += buffers[k].numel();
    }
  }
  return {};
}

namespace {
// Element-wise sums of the ranks' parts of `all` (rank r's n values at r x n), in rank order.
std::vector<double> add_in_rank_order(const std::vector<double>& all, std::size_t n, int ranks) {
  std::vector<double> sum(n, 0.0);
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < n; ++i) sum[i] += all[static_cast<std::size_t>(r) * n + i];
  return sum;
}
} // namespace

expected<std::vector<double>> sum_over_ranks(net::async_collectives& group, const std::vector<double>& values) {
  static_assert(sizeof(double) == sizeof(std::int64_t));
  DSA_CHECK(group.memory() == net::buffer_memory::host, "sum_over_ranks: host values for a group of device buffers");
  std::vector<double> all(values.size() * static_cast<std::size_t>(group.size()));
  DSA_ASSIGN_OR_RETURN(const auto t, group.all_gather(all.data(), values.data(), dtype::i64,
                                                      static_cast<std::int64_t>(values.size())));
  DSA_TRY(group.wait(t));
  return add_in_rank_order(all, values.size(), group.size());
}

expected<std::vector<double>> sum_over_ranks(net::communicator& comm, const std::vector<double>& values,
                                             net::comms_logger* logger, std::string_view caller) {
  static_assert(sizeof(double) == sizeof(std::int64_t));
  const auto n = static_cast<std::int64_t>(values.size());
  std::vector<double> all(values.size() * static_cast<std::size_t>(comm.size()));
  // Each rank's part of the allgather is exactly its n values (n * size elements in all).
  DSA_TRY(logged(logger, "all_gather", n * comm.size() * 8, caller,
                 [&] { return comm.allgather(all.data(), values.data(), dtype::i64, n * comm.size()); }));
  return add_in_rank_order(all, values.size(), comm.size());
}

expected<bool> any_rank(net::communicator& comm, bool mine, net::comms_logger* logger, std::string_view caller) {
  const std::uint8_t flag = mine ? 1 : 0;
  std::vector<std::uint8_t> all(static_cast<std::size_t>(comm.size()));
  DSA_TRY(logged(logger, "all_gather", comm.size(), caller,
                 [&] { return comm.allgather(all.data(), &flag, dtype::u8, comm.size()); }));
  return std::any_of(all.begin(), all.end(), [](std::uint8_t f) { return f != 0; });
}

} // namespace dsa::actors
