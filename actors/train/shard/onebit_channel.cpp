// A shard's 1-bit exchanges; see onebit_channel.hpp.
#include "actors/train/shard/onebit_channel.hpp"

#include "actors/data_parallel.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <cstring>
#include <tuple>
#include <vector>

namespace dsa::train {

std::vector<float> f32_values(const tensor& t) {
  const float* p = t.data<float>();
  return std::vector<float>(p, p + t.numel());
}

tensor f32_tensor(const std::vector<float>& v) {
  tensor t = tensor::empty({static_cast<std::int64_t>(v.size())}, dtype::f32);
  if (!v.empty()) std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(float));
  return t;
}

status onebit_channel::exchange(const std::string& group, float* values, std::int64_t count, bool reset_errors) {
  if (ranks() == 1) return {};
  net::onebit_errors& errors = errors_[group];
  if (reset_errors) errors = net::onebit_errors{};
  const auto start = std::chrono::steady_clock::now();
  DSA_ASSIGN_OR_RETURN(net::onebit_report r, net::compressed_allreduce(*peers_, values, count, errors));
  // The comms logger's size for this call is what the transport counted this rank sending.
  if (logger_)
    logger_->record("compressed_all_reduce", static_cast<std::int64_t>(r.wire_bytes),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), caller_);
  ++pending_.exchanges;
  pending_.payload_bytes += r.bytes_sent;
  pending_.wire_bytes += r.wire_bytes;
  return {};
}

actors::grad_totals onebit_channel::local_totals(const actors::grad_totals& totals) {
  actors::grad_totals t = totals;
  const double n = ranks();
  t.sum_of_squares *= n * n;
  t.own_sum_of_squares *= n * n;
  if (n == 1) return t;
  float bad = std::isfinite(t.sum_of_squares) && std::isfinite(t.own_sum_of_squares) ? 0.0f : 1.0f;
  auto summed = actors::log_collective(logger_, "all_reduce", 4, caller_,
                                       [&] { return peers_->allreduce_sum(&bad, dtype::f32, 1); });
  if (!summed)
    throw std::runtime_error(fmt::format("{}: telling the ranks about an overflow: {}", caller_, summed.err().message));
  if (bad > 0) t.sum_of_squares = t.own_sum_of_squares = std::numeric_limits<double>::infinity();
  return t;
}

void onebit_channel::count_step(std::int64_t elements, bool local) {
  const auto fp16 = static_cast<std::uint64_t>(fp16_ring_allreduce_bytes(static_cast<double>(elements), ranks()));
  ++traffic_.steps;
  traffic_.fp16_bytes += fp16;
  if (local) {
    ++traffic_.local_steps;
    traffic_.local_fp16_bytes += fp16;
    traffic_.exchanges += pending_.exchanges;
    traffic_.payload_bytes += pending_.payload_bytes;
    traffic_.wire_bytes += pending_.wire_bytes;
  }
  pending_ = {};
}

std::map<std::string, tensor> onebit_channel::error_tensors() const {
  std::map<std::string, tensor> out;
  for (const auto& [name, e] : errors_) {
    if (!e.worker.empty()) out[name + ".worker"] = f32_tensor(e.worker);
    if (!e.server.empty()) out[name + ".server"] = f32_tensor(e.server);
  }
  tensor count = tensor::empty({1}, dtype::i64);
  count.data<std::int64_t>()[0] = traffic_.exchanges;
  out["exchanges"] = count;
  return out;
}

status onebit_channel::load_errors(const std::map<std::string, tensor>& tensors,
                                   const std::map<std::string, std::int64_t>& group_numel) {
  const int n = ranks();
  std::map<std::string, net::onebit_errors> loaded;
  for (const auto& [name, numel] : group_numel) {
    net::onebit_errors e;
    const std::int64_t padded = net::onebit_padded(numel, n);
    for (const auto& [field, dst, size] :
         {std::tuple{".worker", &e.worker, padded}, std::tuple{".server", &e.server, padded / n}}) {
      auto it = tensors.find(name + field);
      if (it == tensors.end()) continue; // no exchange yet when saved: zeros
      if (it->second.type() != dtype::f32 || it->second.numel() != size)
        return make_error(errc::format, "error buffer {}{} is {}, expected f32 of {} elements ({} ranks)", name, field,
                          it->second.describe(), size, n);
      *dst = f32_values(it->second);
    }
    if (e.worker.empty() != e.server.empty())
      return make_error(errc::format, "error buffers of {}: one of worker and server is missing", name);
    if (!e.worker.empty()) loaded[name] = std::move(e);
  }
  errors_ = std::move(loaded);
  return {};
}

} // namespace dsa::train
