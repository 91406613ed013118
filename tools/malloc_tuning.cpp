// glibc malloc settings for the dsactor process; see malloc_tuning.hpp.
#include "tools/malloc_tuning.hpp"

#include <cstdlib>
#include <cstring>

#include <malloc.h>

namespace dsa::tools {
namespace {
std::string why_not = "not called";
std::string arenas;
} // namespace

static std::string decide() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr)
    return "GLIBC_TUNABLES sets malloc's own";
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr || std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr)
    return "MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ is set";
  constexpr int one_gib = 1 << 30;
  if (mallopt(M_MMAP_THRESHOLD, one_gib) != 1 || mallopt(M_TRIM_THRESHOLD, one_gib) != 1)
    return "mallopt refused the thresholds";
  // The arena count on its own: many container images export MALLOC_ARENA_MAX.
  if (std::getenv("MALLOC_ARENA_MAX") != nullptr)
    arenas = "MALLOC_ARENA_MAX's arenas";
  else if (mallopt(M_ARENA_MAX, 1) != 1)
    arenas = "glibc's arenas (mallopt refused one)";
  else
    arenas = "one arena";
  return "";
}

std::string tune_malloc() { return why_not = decide(); }

std::string malloc_tuning_report() {
  return why_not.empty() ? "mmap and trim thresholds 1 GiB, " + arenas + " (freed tensor memory kept for reuse)"
                         : "glibc defaults (" + why_not + ")";
}

} // namespace dsa::tools
