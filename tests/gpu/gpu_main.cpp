// doctest main of the gpu suite: runs the cases only when a CUDA device is present, and
// otherwise says why and exits 77, which Meson (and tools/test_summary.py) count as a skip.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "kernels/cuda/cuda_allocator.hpp"

#include <cstdio>

int main(int argc, char** argv) {
  const dsa::cuda::device_probe probe = dsa::cuda::probe_devices();
  if (probe.count == 0) {
    std::printf("SKIPPED gpu suite: %s\n", probe.message.c_str());
    return 77;
  }
  std::printf("gpu suite on %s\n", probe.message.c_str());
  doctest::Context context(argc, argv);
  return context.run();
}
