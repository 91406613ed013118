// A plain reference of the 1-bit compressed allreduce (io/net/compressed_allreduce.hpp),
// all ranks at once, element by element: bits extracted one at a time, no tables, no
// vectors. The tests compare the kernels and the collective with it bit for bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace dsa::test::onebit {

// The kernels' sum of squares (kernels/cpu/onebit.hpp): partial sum i mod 8, added pairwise.
inline double sum_of_squares(const std::vector<float>& y) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (std::size_t i = 0; i < y.size(); ++i) s[i % 8] += static_cast<double>(y[i]) * static_cast<double>(y[i]);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

struct compressed {
  std::vector<std::uint8_t> bits; // MSB first, set: +1
  float scale = 0;
};

// y = x + error; error = y - scale * sign(y); zero counts as +1.
inline compressed compress(const std::vector<float>& x, std::vector<float>& error) {
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] + error[i];
  compressed c;
  c.scale = y.empty() ? 0.0f : static_cast<float>(std::sqrt(sum_of_squares(y) / static_cast<double>(y.size())));
  c.bits.assign(y.size() / 8, 0);
  for (std::size_t i = 0; i < y.size(); ++i) {
    const bool positive = y[i] >= 0.0f;
    if (positive) c.bits[i / 8] = static_cast<std::uint8_t>(c.bits[i / 8] | (1u << (7 - i % 8)));
    error[i] = y[i] - (positive ? c.scale : -c.scale);
  }
  return c;
}

inline float sign_of(const std::vector<std::uint8_t>& bits, std::size_t i) {
  return (bits[i / 8] >> (7 - i % 8)) & 1 ? 1.0f : -1.0f;
}

inline std::int64_t padded(std::int64_t count, int n) {
  if (count == 0) return 0;
  const std::int64_t unit = n * std::lcm<std::int64_t>(n, 8);
  return (count + unit - 1) / unit * unit;
}

struct rank_state {
  std::vector<float> worker, server; // empty: zeros
};

// Every rank's input in, the common result out (count elements); the states advance.
inline std::vector<float> allreduce(const std::vector<std::vector<float>>& inputs, std::vector<rank_state>& states,
                                    std::vector<float>* worker_scales = nullptr,
                                    std::vector<float>* server_scales = nullptr) {
  const int n = static_cast<int>(inputs.size());
  const std::int64_t count = static_cast<std::int64_t>(inputs[0].size());
  const std::int64_t total = padded(count, n), part = total / n;
  std::vector<compressed> worker(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    auto& s = states[static_cast<std::size_t>(r)];
    if (s.worker.empty()) s.worker.assign(static_cast<std::size_t>(total), 0.0f);
    if (s.server.empty()) s.server.assign(static_cast<std::size_t>(part), 0.0f);
    std::vector<float> x(static_cast<std::size_t>(total), 0.0f);
    for (std::int64_t i = 0; i < count; ++i) x[static_cast<std::size_t>(i)] = inputs[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
    worker[static_cast<std::size_t>(r)] = compress(x, s.worker);
    if (worker_scales) worker_scales->push_back(worker[static_cast<std::size_t>(r)].scale);
  }
  std::vector<float> out(static_cast<std::size_t>(total));
  for (int r = 0; r < n; ++r) { // rank r serves chunk r
    std::vector<float> z(static_cast<std::size_t>(part), 0.0f);
    for (std::int64_t i = 0; i < part; ++i) {
      float acc = 0.0f;
      for (int j = 0; j < n; ++j) {
        const auto& w = worker[static_cast<std::size_t>(j)];
        acc += w.scale * sign_of(w.bits, static_cast<std::size_t>(r * part + i));
      }
      z[static_cast<std::size_t>(i)] = acc / static_cast<float>(n);
    }
    const compressed server = compress(z, states[static_cast<std::size_t>(r)].server);
    if (server_scales) server_scales->push_back(server.scale);
    for (std::int64_t i = 0; i < part; ++i)
      out[static_cast<std::size_t>(r * part + i)] = server.scale * sign_of(server.bits, static_cast<std::size_t>(i));
  }
  out.resize(static_cast<std::size_t>(count));
  return out;
}

} // namespace dsa::test::onebit
