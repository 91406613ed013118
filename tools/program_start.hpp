// What dsactor and dsactor-bench do first in main(), before any thread or tensor.
#pragma once

#include "tools/malloc_tuning.hpp"
#include "tools/omp_env.hpp"

#if DSA_HAVE_CUDA
#include "kernels/cuda/cuda_allocator.hpp"
#endif

namespace dsa::tools {

inline void start_program(char** argv) {
  ensure_omp_env(argv); // may re-exec; must run before any thread
  tune_malloc();        // before the first tensor
#if DSA_HAVE_CUDA
  cuda::install_caching_allocator(); // for cuda:N tensors; no CUDA call until one is made
#endif
}

} // namespace dsa::tools
