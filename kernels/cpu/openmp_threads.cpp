// Ending a thread's OpenMP pool; see openmp_threads.hpp.
#include "kernels/cpu/openmp_threads.hpp"

#include <omp.h>

#include <cstring>

#include <dlfcn.h>

namespace dsa::cpu {

namespace {

// Whether the omp_pause_resource_all this process calls is libgomp's: a runtime preloaded
// in its place (LLVM's or Intel's, whose hard pause shuts down the whole runtime) could
// take the symbol whatever omp.h was compiled against.
bool runtime_is_libgomp() {
  static const bool is = [] {
    Dl_info info{};
    const auto fn = reinterpret_cast<void*>(&omp_pause_resource_all);
    return ::dladdr(fn, &info) != 0 && info.dli_fname != nullptr && std::strstr(info.dli_fname, "libgomp") != nullptr;
  }();
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
