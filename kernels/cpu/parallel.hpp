// Splitting an elementwise loop over [0, n) into OpenMP chunks.
#pragma once

#include <algorithm>
#include <cstdint>

namespace dsa::cpu {

// Calls fn(begin, end) over [0, n): on one thread below `threshold` elements, else in
// chunks of `chunk` elements spread statically over the OpenMP threads.
template <class Fn>
void for_chunks(std::int64_t n, std::int64_t chunk, std::int64_t threshold, Fn fn) {
  if (n < threshold) {
    fn(std::int64_t{0}, n);
    return;
  }
  const std::int64_t chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < chunks; ++i) {
    const std::int64_t begin = i * chunk;
    fn(begin, std::min(n, begin + chunk));
  }
}

} // namespace dsa::cpu
