// OMP_WAIT_POLICY=passive for the dsactor process by re-exec; see omp_env.hpp.
#include "tools/omp_env.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

namespace dsa::tools {

// Why: several pipeline-stage actors call OpenMP kernels at the same time, each with its own
// thread team. libgomp's default lets idle team threads spin for a while before sleeping, and
// on a machine with fewer cores than spinning threads they take the cores from the threads
// doing work (bert-base forward on a loaded 2-core machine: 6.7 s spinning, 1.5 s passive).
// libgomp reads OMP_WAIT_POLICY once, in its constructor when the library is loaded, before
// main runs, so setting it here only takes effect in a new process image: hence execv.
void ensure_passive_omp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr)
    return; // chosen by the user, or set by us before the re-exec: never exec twice
  if (::setenv("OMP_WAIT_POLICY", "passive", 1) != 0) {
    fmt::print(stderr, "dsactor: setenv OMP_WAIT_POLICY failed ({}); OpenMP threads may spin\n",
               std::strerror(errno));
    return;
  }
  ::execv("/proc/self/exe", argv); // returns only on failure
  fmt::print(stderr,
             "dsactor: re-exec of /proc/self/exe with OMP_WAIT_POLICY=passive failed ({}); "
             "OpenMP threads may spin\n",
             std::strerror(errno));
}

} // namespace dsa::tools
