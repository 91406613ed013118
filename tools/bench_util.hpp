// Small helpers shared by the benchmarks: best-of-N wall-clock timing.
#pragma once

#include <chrono>
#include <functional>

namespace dsa::tools {

// Runs `body` once to warm up, then `reps` times; returns the best time in seconds.
inline double best_seconds(int reps, const std::function<void()>& body) {
  body();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    body();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s < best) best = s;
  }
  return best;
}

} // namespace dsa::tools
