// OpenMP environment of the dsactor process, fixed before libgomp reads it.
#pragma once

#include <string>

namespace dsa::tools {

// Idle OpenMP team threads spin this many times (libgomp's GOMP_SPINCOUNT) before they
// sleep, when dsactor chooses (below). Between a stage's parallel regions the thread that
// starts them mostly spends under 50 us (89% of the gaps in a bf16 BERT-mini step on a
// 2-core Zen 5): 3000 to 30000 spins removed about three quarters of the sleeps and their
// wake-ups there, and made the step about 5% faster (README, CPU instruction sets).
inline constexpr const char* brief_spin = "10000";

// What dsactor sets for itself: empty strings leave a variable as it is.
struct omp_env_choice {
  std::string wait_policy; // OMP_WAIT_POLICY
  std::string spincount;   // GOMP_SPINCOUNT
  bool changes() const { return !wait_policy.empty() || !spincount.empty(); }
};

// The choice from the environment as found (nullptr: unset):
// - OMP_WAIT_POLICY set (by the user): nothing; the user's settings stand;
// - else OMP_WAIT_POLICY=passive: idle threads sleep rather than spin, since several
//   actors' teams (pipeline stages in one process) run at once and spinning threads would
//   take the cores from the working ones; libgomp then spins not at all while threads
//   outnumber cores, and GOMP_SPINCOUNT times otherwise;
// - and, when GOMP_SPINCOUNT is unset, GOMP_SPINCOUNT=brief_spin when this is the host's
//   only rank of the job (local_ranks <= 1), else 0: ranks in other processes on the same
//   cores cannot be seen by libgomp, so there they never spin.
// chosen: DSA_OMP_ENV, which dsactor sets with its choice: a process image that has it
// has been chosen for already (it stops a re-exec loop), and returns nothing.
omp_env_choice choose_omp_env(const char* wait_policy, const char* spincount, const char* chosen, int local_ranks);

// The number of this job's ranks on this host from the launcher's variables (LOCAL_SIZE,
// LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE); 1 when none is set or readable.
int local_ranks_from_environment();

// Applies choose_omp_env to this process: sets the variables and DSA_OMP_ENV, then
// re-executes this program (/proc/self/exe, same argv) so that the new image's libgomp
// reads them at load. Returns when there is nothing to change or the re-exec failed (a
// warning on stderr; the run goes on with libgomp's defaults). Call first in main: nothing
// done before it survives the exec.
void ensure_omp_env(char** argv);

// One line for dsactor report: the settings in force and who chose them, e.g.
// "OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=10000 (dsactor set OMP_WAIT_POLICY=passive
// GOMP_SPINCOUNT=10000: one rank on this host)".
std::string omp_env_report();

// Whether `name` is an OpenMP variable this process's dsactor set for itself (DSA_OMP_ENV
// present): a launcher drops those from its ranks' environment, so that each rank chooses
// for its own host and rank count. The user's own settings are passed on.
bool chosen_for_this_process(const std::string& name);

} // namespace dsa::tools
