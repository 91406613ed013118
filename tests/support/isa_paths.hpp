// The vector paths (kernels/cpu/isa.hpp) a kernel test runs on this CPU: scalar always,
// then AVX2 and AVX-512 where the CPU has them, lowest first.
#pragma once

#include "kernels/cpu/isa.hpp"

#include <vector>

namespace dsa::test {

inline std::vector<cpu::isa> isa_paths() {
  const cpu::isa best = cpu::best_isa();
  std::vector<cpu::isa> paths{cpu::isa::scalar};
  if (best != cpu::isa::scalar) paths.push_back(cpu::isa::avx2);
  if (best == cpu::isa::avx512) paths.push_back(cpu::isa::avx512);
  return paths;
}

} // namespace dsa::test
