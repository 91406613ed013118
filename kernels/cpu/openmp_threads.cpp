// Ending a thread's OpenMP pool; see openmp_threads.hpp.
#include "kernels/cpu/openmp_threads.hpp"

#include <omp.h>

namespace dsa::cpu {

bool release_openmp_threads() {
#ifdef _LIBGOMP_OMP_LOCK_DEFINED // libgomp's omp.h: its pause is per calling thread
  if (omp_in_parallel()) return false;
  return omp_pause_resource_all(omp_pause_hard) == 0;
#else
  return false;
#endif
}

} // namespace dsa::cpu
