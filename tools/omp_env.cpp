// The OpenMP environment dsactor chooses for itself, applied by re-exec; see omp_env.hpp.
#include "tools/omp_env.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

namespace dsa::tools {

namespace {

constexpr const char* chosen_marker = "DSA_OMP_ENV";

} // namespace

// Why passive: several pipeline-stage actors call OpenMP kernels at the same time, each with
// its own thread team, and with libgomp's default (active for a while) the idle ones took
// the cores from the ones working (bert-base forward on a loaded 2-core machine: 6.7 s
// spinning, 1.5 s passive). Why a brief spin on top: with one team per process, sleeping
// after every region cost a wake-up per region, at 20-25 us under this hypervisor.
omp_env_choice choose_omp_env(const char* wait_policy, const char* spincount, const char* chosen, int local_ranks) {
  omp_env_choice c;
  if (chosen != nullptr || wait_policy != nullptr) return c;
  c.wait_policy = "passive";
  if (spincount == nullptr) c.spincount = local_ranks <= 1 ? brief_spin : "0";
  return c;
}

int local_ranks_from_environment() {
  for (const char* name : {"LOCAL_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v, &end, 10);
    if (errno == 0 && end != v && *end == '\0' && n >= 1 && n <= 1 << 20) return static_cast<int>(n);
  }
  return 1;
}

void ensure_omp_env(char** argv) {
  const omp_env_choice c = choose_omp_env(std::getenv("OMP_WAIT_POLICY"), std::getenv("GOMP_SPINCOUNT"),
                                          std::getenv(chosen_marker), local_ranks_from_environment());
  if (!c.changes()) return;
  const std::string what = c.spincount.empty() ? "OMP_WAIT_POLICY=" + c.wait_policy
                                               : "OMP_WAIT_POLICY=" + c.wait_policy + " GOMP_SPINCOUNT=" + c.spincount;
  const bool set = ::setenv("OMP_WAIT_POLICY", c.wait_policy.c_str(), 1) == 0 &&
                   (c.spincount.empty() || ::setenv("GOMP_SPINCOUNT", c.spincount.c_str(), 1) == 0) &&
                   ::setenv(chosen_marker, what.c_str(), 1) == 0;
  if (!set) {
    fmt::print(stderr, "dsactor: setting {} failed ({}); OpenMP keeps libgomp's defaults\n", what,
               std::strerror(errno));
    return;
  }
  ::execv("/proc/self/exe", argv); // returns only on failure
  fmt::print(stderr, "dsactor: re-exec of /proc/self/exe with {} failed ({}); OpenMP keeps libgomp's defaults\n",
             what, std::strerror(errno));
}

std::string omp_env_report() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  std::string out = fmt::format("OMP_WAIT_POLICY={} GOMP_SPINCOUNT={}", policy ? policy : "(unset)",
                                spin ? spin : "(unset)");
  const char* chosen = std::getenv(chosen_marker);
  if (chosen == nullptr) return out + " (as set by the user)";
  const int ranks = local_ranks_from_environment();
  return out + fmt::format(" (dsactor set {}: {})", chosen,
                           ranks <= 1 ? std::string("one rank on this host")
                                      : fmt::format("{} ranks on this host, so no spinning", ranks));
}

bool chosen_for_this_process(const std::string& name) {
  const char* chosen = std::getenv(chosen_marker);
  if (chosen == nullptr) return false;
  if (name == chosen_marker) return true;
  // Only the variables the marker names were set by dsactor (a user's GOMP_SPINCOUNT stays).
  const std::string what = chosen;
  return (name == "OMP_WAIT_POLICY" || name == "GOMP_SPINCOUNT") && what.find(name + "=") != std::string::npos;
}

} // namespace dsa::tools
