// Element-by-element comparison of arrays for tests: reports max abs and rel
// error and the worst index, never only a norm.
#pragma once

#include "tests/support/tolerances.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <string>

namespace dsa::test {

struct comparison {
  double max_abs = 0.0;
  double max_rel = 0.0;
  std::int64_t worst = -1; // index of the worst violation (or of max_abs when none)
  std::int64_t violations = 0;
  std::string summary;
};

// Element i passes when |a - b| <= tol.abs + tol.rel * |b| (b is the reference).
// NaN in either fails unless both are NaN at the same index.
template <class A, class B>
comparison compare(const A* actual, const B* expected, std::int64_t n, tolerance tol) {
  comparison c;
  double worst_excess = -1.0;
  for (std::int64_t i = 0; i < n; ++i) {
    double a = static_cast<double>(actual[i]), b = static_cast<double>(expected[i]);
    if (std::isnan(a) && std::isnan(b)) continue;
    double d = std::fabs(a - b);
    if (std::isnan(d)) d = INFINITY;
    double r = d / std::max(std::fabs(b), 1e-30);
    if (d > c.max_abs) c.max_abs = d;
    if (std::fabs(b) > tol.abs && r > c.max_rel) c.max_rel = r;
    double excess = d - (tol.abs + tol.rel * std::fabs(b));
    if (excess > 0) ++c.violations;
    if (excess > worst_excess) {
      worst_excess = excess;
      c.worst = i;
    }
  }
  c.summary = fmt::format("n={} max_abs={:.3g} max_rel={:.3g} violations={}", n, c.max_abs, c.max_rel,
                          c.violations);
  if (c.worst >= 0)
    c.summary += fmt::format(" worst[{}]: actual={:.9g} expected={:.9g} (tol abs {:.1g} rel {:.1g}: {})",
                             c.worst, static_cast<double>(actual[c.worst]),
                             static_cast<double>(expected[c.worst]), tol.abs, tol.rel, tol.reason);
  return c;
}

} // namespace dsa::test

// Asserts two arrays agree within a tolerance from the table; prints the worst element.
#define DSA_CHECK_CLOSE(actual, expected, n, tol)                                   \
  do {                                                                              \
    auto dsa_cmp_ = ::dsa::test::compare((actual), (expected), (n), (tol));        \
    INFO(dsa_cmp_.summary);                                                         \
    CHECK(dsa_cmp_.violations == 0);                                                \
  } while (0)
