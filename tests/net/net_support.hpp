// Helpers for the io/net tests: run one function per rank on its own thread over a
// local_group, and typed test buffers of f32/f16/bf16 values.
#pragma once

#include "core/half.hpp"
#include "io/net/communicator.hpp"
#include "io/net/local_transport.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/random.hpp"

#include <cstring>
#include <functional>
#include <thread>
#include <vector>

namespace dsa::test {

// Runs fn(transport, rank) for every rank of a fresh group of n, each on its own thread;
// returns when all have returned.
inline void run_ranks(int n, const std::function<void(net::transport&, int)>& fn) {
  net::local_group group(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] { fn(group.at(r), r); });
  for (auto& t : threads)
    t.join();
}

// A contiguous buffer of `type` (f32, f16 or bf16).
struct typed_buffer {
  dtype type = dtype::f32;
  std::vector<std::byte> bytes;

  typed_buffer(dtype t, std::int64_t n)
      : type(t), bytes(static_cast<std::size_t>(n) * dtype_size(t)) {}
  std::int64_t size() const { return static_cast<std::int64_t>(bytes.size() / dtype_size(type)); }
  void* data() { return bytes.data(); }
  float get(std::int64_t i) const {
    if (type == dtype::f32) {
      float f;
      std::memcpy(&f, bytes.data() + i * 4, 4);
      return f;
    }
    std::uint16_t h;
    std::memcpy(&h, bytes.data() + i * 2, 2);
    return type == dtype::f16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
  void set(std::int64_t i, float v) {
    if (type == dtype::f32) {
      std::memcpy(bytes.data() + i * 4, &v, 4);
      return;
    }
    std::uint16_t h = type == dtype::f16 ? f32_to_f16(v) : f32_to_bf16(v);
    std::memcpy(bytes.data() + i * 2, &h, 2);
  }
  std::vector<float> widened() const {
    std::vector<float> out(static_cast<std::size_t>(size()));
    for (std::int64_t i = 0; i < size(); ++i)
      out[static_cast<std::size_t>(i)] = get(i);
    return out;
  }
  bool operator==(const typed_buffer& o) const { return type == o.type && bytes == o.bytes; }
};

// n values uniform in [-1, 1) rounded to `type`, fixed by (seed, rank).
inline typed_buffer random_buffer(dtype type, std::int64_t n, std::uint32_t seed, int rank) {
  typed_buffer b(type, n);
  auto v = random_vector(n, -1.0f, 1.0f, seed * 131u + static_cast<std::uint32_t>(rank));
  for (std::int64_t i = 0; i < n; ++i)
    b.set(i, v[static_cast<std::size_t>(i)]);
  return b;
}

// The reference sum: per element, sum over ranks 0..N-1 in double, rounded to f32 and
// then to the dtype (as a typed_buffer, widened back to float for comparison).
inline std::vector<float> reference_sum(const std::vector<typed_buffer>& inputs) {
  const std::int64_t n = inputs.front().size();
  typed_buffer out(inputs.front().type, n);
  for (std::int64_t i = 0; i < n; ++i) {
    double s = 0.0;
    for (const auto& in : inputs)
      s += static_cast<double>(in.get(i));
    out.set(i, static_cast<float>(s));
  }
  return out.widened();
}

inline const tolerance& sum_tolerance(dtype type) {
  return type == dtype::f32   ? collective_sum_f32
         : type == dtype::f16 ? collective_sum_f16
                              : collective_sum_bf16;
}

} // namespace dsa::test
