// The OpenMP environment dsactor chooses, applied by re-exec; see omp_env.hpp.
#include "tools/omp_env.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

namespace dsa::tools {

namespace {

constexpr const char* marker_name = "DSA_OMP_ENV";
constexpr const char* chosen_names[] = {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"};

// A positive count at the start of `v` ("2", or slurm's "2(x3),1"); 0 when there is none.
long leading_count(const char* v) {
  if (v == nullptr || *v < '1' || *v > '9') return 0;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (errno != 0 || n > (1L << 20)) return 0;
  return (*end == '\0' || *end == '(' || *end == ',') ? n : 0;
}

std::string reason(int local_ranks, const omp_env_choice& c) {
  const std::string ranks = local_ranks <= 1 ? "one rank on this host" : fmt::format("{} ranks on this host", local_ranks);
  if (c.spincount.empty()) return ranks + "; GOMP_SPINCOUNT is the user's";
  return c.spincount == "0" ? ranks + ", so no spinning" : ranks;
}

// "OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=10000"
std::string settings(const omp_env_choice& c) {
  std::string s = "OMP_WAIT_POLICY=" + c.wait_policy;
  if (!c.spincount.empty()) s += " GOMP_SPINCOUNT=" + c.spincount;
  return s;
}

bool is_omp_setting(const std::string& name) {
  for (const char* n : chosen_names)
    if (name == n) return true;
  return false;
}

} // namespace

// Why passive: several pipeline-stage actors call OpenMP kernels at the same time, each with
// its own thread team, and with libgomp's default (active for a while) the idle ones took
// the cores from the ones working (bert-base forward on a loaded 2-core machine: 6.7 s
// spinning, 1.5 s passive). Why a brief spin on top: with one team per process, sleeping
// after every region cost a wake-up per region, at 20-25 us under this hypervisor.
omp_env_choice choose_omp_env(const char* wait_policy, const char* spincount, int local_ranks) {
  omp_env_choice c;
  if (wait_policy != nullptr) return c;
  c.wait_policy = "passive";
  if (spincount == nullptr) c.spincount = local_ranks <= 1 ? brief_spin : "0";
  return c;
}

int local_ranks_from_environment() {
  for (const char* name : {"LOCAL_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                           "SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE"})
    if (const long n = leading_count(std::getenv(name)); n >= 1) return static_cast<int>(n);
  return 1;
}

omp_marker parse_omp_marker(const std::string& marker) {
  omp_marker m;
  const auto paren = marker.find(" (");
  std::string head = marker.substr(0, paren);
  for (std::size_t at = 0; at < head.size();) {
    const auto space = head.find(' ', at);
    const std::string word = head.substr(at, space == std::string::npos ? std::string::npos : space - at);
    const auto eq = word.find('=');
    if (eq != std::string::npos && is_omp_setting(word.substr(0, eq)))
      m.settings.emplace_back(word.substr(0, eq), word.substr(eq + 1));
    if (space == std::string::npos) break;
    at = space + 1;
  }
  if (paren != std::string::npos && marker.compare(paren, 6, " (pid ") == 0)
    m.pid = std::strtol(marker.c_str() + paren + 6, nullptr, 10);
  return m;
}

void ensure_omp_env(char** argv) {
  if (const char* text = std::getenv(marker_name)) {
    const omp_marker m = parse_omp_marker(text);
    if (m.pid == 0 || m.pid == static_cast<long>(::getpid())) return; // a launcher's choice, or ours
    // Inherited from a dsactor that chose for itself: what still holds its values is not the user's.
    for (const auto& [name, value] : m.settings)
      if (const char* now = std::getenv(name.c_str()); now != nullptr && value == now) ::unsetenv(name.c_str());
    ::unsetenv(marker_name);
  }
  const int ranks = local_ranks_from_environment();
  const omp_env_choice c = choose_omp_env(std::getenv("OMP_WAIT_POLICY"), std::getenv("GOMP_SPINCOUNT"), ranks);
  if (!c.changes()) return;
  const std::string what = settings(c);
  const std::string marker = fmt::format("{} (pid {}: {})", what, static_cast<long>(::getpid()), reason(ranks, c));
  const bool set = ::setenv("OMP_WAIT_POLICY", c.wait_policy.c_str(), 1) == 0 &&
                   (c.spincount.empty() || ::setenv("GOMP_SPINCOUNT", c.spincount.c_str(), 1) == 0) &&
                   ::setenv(marker_name, marker.c_str(), 1) == 0;
  if (!set) {
    fmt::print(stderr, "dsactor: setting {} failed ({}); OpenMP keeps libgomp's defaults\n", what,
               std::strerror(errno));
    return;
  }
  ::execv("/proc/self/exe", argv); // returns only on failure
  fmt::print(stderr, "dsactor: re-exec of /proc/self/exe with {} failed ({}); OpenMP keeps libgomp's defaults\n",
             what, std::strerror(errno));
}

bool chosen_for_this_process(const std::string& name) {
  const char* text = std::getenv(marker_name);
  if (text == nullptr) return false;
  if (name == marker_name) return true;
  for (const auto& [k, v] : parse_omp_marker(text).settings)
    if (k == name) return true;
  return false;
}

std::vector<std::pair<std::string, std::string>> rank_omp_env(const char* user_policy, const char* user_spincount,
                                                              int local_ranks) {
  const omp_env_choice c = choose_omp_env(user_policy, user_spincount, local_ranks);
  if (!c.changes()) return {};
  std::vector<std::pair<std::string, std::string>> env{{"OMP_WAIT_POLICY", c.wait_policy}};
  if (!c.spincount.empty()) env.emplace_back("GOMP_SPINCOUNT", c.spincount);
  env.emplace_back(marker_name, fmt::format("{} (dsactor launch: {})", settings(c), reason(local_ranks, c)));
  return env;
}

std::vector<std::pair<std::string, std::string>> launched_rank_omp_env(int local_ranks) {
  auto users = [](const char* name) { return chosen_for_this_process(name) ? nullptr : std::getenv(name); };
  return rank_omp_env(users("OMP_WAIT_POLICY"), users("GOMP_SPINCOUNT"), local_ranks);
}

std::string omp_env_report() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  std::string out = fmt::format("OMP_WAIT_POLICY={} GOMP_SPINCOUNT={}", policy ? policy : "(unset)",
                                spin ? spin : "(unset)");
  const char* m = std::getenv(marker_name);
  if (m == nullptr) return out + " (as set by the user)";
  const std::string marker = m;
  const auto paren = marker.find(" (");
  // e.g. "... (dsactor set OMP_WAIT_POLICY=passive, pid 4242: one rank on this host)"
  return out + " (dsactor set " + marker.substr(0, paren) + ", " +
         (paren == std::string::npos ? std::string(")") : marker.substr(paren + 2));
}

} // namespace dsa::tools
