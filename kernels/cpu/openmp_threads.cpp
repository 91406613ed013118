// Ending a thread's OpenMP pool; see openmp_threads.hpp.
#include "kernels/cpu/openmp_threads.hpp"

#include <omp.h>

#include <dlfcn.h>

namespace dsa::cpu {

namespace {

// Whether the OpenMP runtime in this process is libgomp: LLVM's and Intel's (whose hard
// pause shuts down the whole runtime, under other threads' regions) export the __kmpc_
// entry points, libgomp does not, and either can be swapped in at load (LD_PRELOAD, or
// LLVM's libgomp.so alias of libomp) whatever omp.h this was compiled against.
bool runtime_is_libgomp() {
  static const bool is = ::dlsym(RTLD_DEFAULT, "__kmpc_fork_call") == nullptr;
  return is;
}

} // namespace

bool release_openmp_threads() {
#ifdef _LIBGOMP_OMP_LOCK_DEFINED // compiled against libgomp's omp.h
  if (!runtime_is_libgomp() || omp_in_parallel()) return false;
  return omp_pause_resource_all(omp_pause_hard) == 0;
#else
  return false;
#endif
}

} // namespace dsa::cpu
