// Central finite differences of a scalar function of a parameter vector.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace dsa::test {

// grad[i] = (f(x + h e_i) - f(x - h e_i)) / 2h for i in indices (all when empty).
// x is restored after each probe.
template <class T>
std::vector<double> central_difference(std::vector<T>& x, const std::function<double()>& f, double h,
                                       const std::vector<std::int64_t>& indices = {}) {
  std::vector<double> grad(x.size(), 0.0);
  auto probe = [&](std::int64_t i) {
    T saved = x[static_cast<std::size_t>(i)];
    x[static_cast<std::size_t>(i)] = static_cast<T>(saved + h);
    double up = f();
    x[static_cast<std::size_t>(i)] = static_cast<T>(saved - h);
    double down = f();
    x[static_cast<std::size_t>(i)] = saved;
    grad[static_cast<std::size_t>(i)] = (up - down) / (2 * h);
  };
  if (indices.empty())
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(x.size()); ++i) probe(i);
  else
    for (auto i : indices) probe(i);
  return grad;
}

} // namespace dsa::test
