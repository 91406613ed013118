// Test helper: two parameter lists agree to the layout-equivalence tolerance.
#pragma once

#include "core/tensor.hpp"
#include "tests/support/compare.hpp"

#include <doctest/doctest.h>

#include <vector>

namespace dsa::test {

inline void check_parameters_close(const std::vector<tensor>& got, const std::vector<tensor>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    REQUIRE(got[i].shape() == want[i].shape());
    DSA_CHECK_CLOSE(got[i].data<float>(), want[i].data<float>(), got[i].numel(), layout_equivalence);
  }
}

} // namespace dsa::test
