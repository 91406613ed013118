// OpenMP environment of the dsactor process, fixed before libgomp reads it.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dsa::tools {

// Idle OpenMP team threads spin this many times (libgomp's GOMP_SPINCOUNT) before they
// sleep, when dsactor chooses (below). Between a stage's parallel regions the thread that
// starts them mostly spends under 50 us (89% of the gaps in a bf16 BERT-mini step on a
// 2-core Zen 5): 3000 to 30000 spins removed about three quarters of the sleeps and their
// wake-ups there, and most quick-start steps ran 2-17% faster (docs/cpu-kernels.md,
// "Sleeping or spinning OpenMP threads").
inline constexpr const char* brief_spin = "10000";

// What dsactor sets: empty strings leave a variable as it is.
struct omp_env_choice {
  std::string wait_policy; // OMP_WAIT_POLICY
  std::string spincount;   // GOMP_SPINCOUNT
  bool changes() const { return !wait_policy.empty() || !spincount.empty(); }
};

// The choice from the user's settings (nullptr: unset):
// - OMP_WAIT_POLICY set: nothing; the user's settings stand;
// - else OMP_WAIT_POLICY=passive: idle threads sleep rather than spin, since several
//   actors' teams (pipeline stages in one process) run at once and spinning threads would
//   take the cores from the working ones; libgomp then spins not at all while its threads
//   outnumber the cores it was given, and GOMP_SPINCOUNT times otherwise;
// - and, when GOMP_SPINCOUNT is unset too, GOMP_SPINCOUNT=brief_spin when this is the
//   host's only rank of the job (local_ranks <= 1), else 0: ranks in other processes on
//   the same cores cannot be seen by libgomp, so there they never spin.
omp_env_choice choose_omp_env(const char* wait_policy, const char* spincount, int local_ranks);

// The number of this job's ranks on this host from the launchers' variables (LOCAL_SIZE,
// LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, SLURM_NTASKS_PER_NODE,
// SLURM_STEP_TASKS_PER_NODE: the first readable one); 1 when none is.
int local_ranks_from_environment();

// DSA_OMP_ENV records a choice: the variables set and by whom, e.g.
// "OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=10000 (pid 4242: one rank on this host)" or
// "... (dsactor launch: 2 ranks on this host)". A process whose marker names another pid
// inherited it from a dsactor that chose for itself: the variables that still hold the
// recorded values are not the user's. A launcher's marker (no pid) is kept by the rank and
// its descendants.
//
// Applies the choice to this process (its launcher's choice, when the marker is one, stands):
// clears an inherited choice, sets the variables and the marker, then re-executes this
// program (/proc/self/exe, same argv) so that the new image's libgomp reads them at load
// (the pid is kept, which ends the loop). Returns when there is nothing to change or the
// re-exec failed (a warning on stderr; libgomp's defaults then). Call first in main:
// nothing done before it survives the exec.
void ensure_omp_env(char** argv);

// The variables a launcher gives a rank with local_ranks ranks on its host: the choice
// above from the user's settings (not the launcher's own choice), with its marker; empty
// when the user set OMP_WAIT_POLICY (the user's settings are passed on as they are).
std::vector<std::pair<std::string, std::string>> launched_rank_omp_env(int local_ranks);

// The variables a rank gets from the user's settings (nullptr: unset) for its host's rank
// count: choose_omp_env with a launcher's marker; empty when the user set the policy.
std::vector<std::pair<std::string, std::string>> rank_omp_env(const char* user_policy, const char* user_spincount,
                                                              int local_ranks);

// A DSA_OMP_ENV marker read back: the variables it records with their values, and the pid
// that chose them (0: a launcher chose them for its rank).
struct omp_marker {
  std::vector<std::pair<std::string, std::string>> settings;
  long pid = 0;
};
omp_marker parse_omp_marker(const std::string& marker);

// Whether `name` is one of the OpenMP variables (or DSA_OMP_ENV itself) that dsactor, not
// the user, set in this process: a launcher does not pass those on.
bool chosen_for_this_process(const std::string& name);

// One line for dsactor report: the settings in force and who chose them.
std::string omp_env_report();

} // namespace dsa::tools
