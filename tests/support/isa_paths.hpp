// The vector paths (kernels/cpu/isa.hpp) a kernel test runs on this CPU: scalar always,
// then AVX2 and AVX-512 where the CPU has them (or DSA_CPU_ISA allows), lowest first. Each
// path handed out is noted for the test summary's "vector paths run" line.
#pragma once

#include "kernels/cpu/isa.hpp"
#include "tests/support/run_notes.hpp"

#include <vector>

namespace dsa::test {

inline std::vector<cpu::isa> isa_paths() {
  const cpu::isa best = cpu::best_isa();
  std::vector<cpu::isa> paths{cpu::isa::scalar};
  if (best != cpu::isa::scalar) paths.push_back(cpu::isa::avx2);
  if (best == cpu::isa::avx512) paths.push_back(cpu::isa::avx512);
  for (cpu::isa p : paths) note_path_run(cpu::isa_name(p));
  return paths;
}

} // namespace dsa::test
