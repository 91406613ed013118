// The OpenMP settings dsactor chooses (tools/omp_env.cpp), compiled in.
#include "tools/omp_env.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <unistd.h>

using dsa::tools::choose_omp_env;

namespace {

// Sets or unsets environment variables for one test and restores them after.
struct scoped_env {
  struct saved {
    std::string name;
    bool was_set;
    std::string value;
  };
  std::vector<saved> old;
  scoped_env() {
    for (const char* n : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "DSA_OMP_ENV", "LOCAL_SIZE", "LOCAL_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE",
                          "SLURM_STEP_TASKS_PER_NODE"})
      set(n, nullptr);
  }
  void set(const char* name, const char* value) {
    const char* v = std::getenv(name);
    old.push_back({name, v != nullptr, v ? v : ""});
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~scoped_env() {
    for (auto it = old.rbegin(); it != old.rend(); ++it)
      it->was_set ? ::setenv(it->name.c_str(), it->value.c_str(), 1) : ::unsetenv(it->name.c_str());
  }
};

std::string value_of(const std::vector<std::pair<std::string, std::string>>& env, const std::string& name) {
  for (const auto& [k, v] : env)
    if (k == name) return v;
  return "(none)";
}

} // namespace

TEST_CASE("omp_env: alone on the host, passive with a brief spin") {
  const auto c = choose_omp_env(nullptr, nullptr, 1);
  CHECK(c.changes());
  CHECK(c.wait_policy == "passive");
  CHECK(c.spincount == dsa::tools::brief_spin);
}

TEST_CASE("omp_env: several ranks on the host never spin") {
  const auto c = choose_omp_env(nullptr, nullptr, 2);
  CHECK(c.wait_policy == "passive");
  CHECK(c.spincount == "0");
}

TEST_CASE("omp_env: the user's settings stand") {
  CHECK_FALSE(choose_omp_env("active", nullptr, 1).changes());
  CHECK_FALSE(choose_omp_env("passive", "5", 4).changes());
  // A user's spin count alone: passive is still chosen, the spin count is left.
  const auto c = choose_omp_env(nullptr, "123", 1);
  CHECK(c.wait_policy == "passive");
  CHECK(c.spincount.empty());
}

TEST_CASE("omp_env: local rank count from the launchers' variables") {
  scoped_env env;
  CHECK(dsa::tools::local_ranks_from_environment() == 1);
  env.set("SLURM_STEP_TASKS_PER_NODE", "4(x2),1");
  CHECK(dsa::tools::local_ranks_from_environment() == 4);
  env.set("SLURM_NTASKS_PER_NODE", "3");
  CHECK(dsa::tools::local_ranks_from_environment() == 3);
  env.set("MPI_LOCALNRANKS", "5");
  CHECK(dsa::tools::local_ranks_from_environment() == 5);
  env.set("OMPI_COMM_WORLD_LOCAL_SIZE", "6");
  CHECK(dsa::tools::local_ranks_from_environment() == 6);
  env.set("LOCAL_SIZE", "2");
  CHECK(dsa::tools::local_ranks_from_environment() == 2); // dsactor launch's own first
  env.set("LOCAL_SIZE", "two");
  CHECK(dsa::tools::local_ranks_from_environment() == 6); // unreadable: the next one
  env.set("LOCAL_SIZE", "0");
  env.set("OMPI_COMM_WORLD_LOCAL_SIZE", nullptr);
  env.set("MPI_LOCALNRANKS", "1x");
  env.set("SLURM_NTASKS_PER_NODE", nullptr);
  env.set("SLURM_STEP_TASKS_PER_NODE", nullptr);
  CHECK(dsa::tools::local_ranks_from_environment() == 1);
}

TEST_CASE("omp_env: what dsactor chose is not passed on as the user's") {
  scoped_env env;
  CHECK_FALSE(dsa::tools::chosen_for_this_process("OMP_WAIT_POLICY"));
  const std::string own = "OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=10000 (pid " + std::to_string(::getpid()) +
                          ": one rank on this host)";
  env.set("DSA_OMP_ENV", own.c_str());
  env.set("OMP_WAIT_POLICY", "passive");
  env.set("GOMP_SPINCOUNT", "10000");
  CHECK(dsa::tools::chosen_for_this_process("OMP_WAIT_POLICY"));
  CHECK(dsa::tools::chosen_for_this_process("GOMP_SPINCOUNT"));
  CHECK(dsa::tools::chosen_for_this_process("DSA_OMP_ENV"));
  CHECK_FALSE(dsa::tools::chosen_for_this_process("OMP_NUM_THREADS"));
  for (const char* other : {"Y", "T", "POLICY", "WAIT_POLICY", "SPINCOUNT", "OMP_SPINCOUNT", "passive"})
    CHECK_FALSE(dsa::tools::chosen_for_this_process(other)); // whole names only
  // A launcher's ranks get their own choice, from the user's settings only.
  auto two = dsa::tools::launched_rank_omp_env(2);
  CHECK(value_of(two, "OMP_WAIT_POLICY") == "passive");
  CHECK(value_of(two, "GOMP_SPINCOUNT") == "0");
  CHECK(value_of(two, "DSA_OMP_ENV") == "OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=0 (dsactor launch: 2 ranks on this host, so no spinning)");
  CHECK(value_of(dsa::tools::launched_rank_omp_env(1), "GOMP_SPINCOUNT") == dsa::tools::brief_spin);
  // The user had set GOMP_SPINCOUNT: the marker names only the policy, and the ranks keep it.
  env.set("DSA_OMP_ENV", ("OMP_WAIT_POLICY=passive (pid " + std::to_string(::getpid()) + ": x)").c_str());
  env.set("GOMP_SPINCOUNT", "77");
  CHECK(dsa::tools::chosen_for_this_process("OMP_WAIT_POLICY"));
  CHECK_FALSE(dsa::tools::chosen_for_this_process("GOMP_SPINCOUNT"));
  two = dsa::tools::launched_rank_omp_env(2);
  CHECK(value_of(two, "OMP_WAIT_POLICY") == "passive");
  CHECK(value_of(two, "GOMP_SPINCOUNT") == "(none)");
  CHECK(value_of(two, "DSA_OMP_ENV") == "OMP_WAIT_POLICY=passive (dsactor launch: 2 ranks on this host; GOMP_SPINCOUNT is the user's)");
  // The user's policy: nothing chosen for the ranks.
  env.set("DSA_OMP_ENV", nullptr);
  env.set("OMP_WAIT_POLICY", "active");
  CHECK(dsa::tools::launched_rank_omp_env(2).empty());
}

TEST_CASE("omp_env: dsactor report's line says what is in force and who chose it") {
  scoped_env env;
  env.set("OMP_WAIT_POLICY", "active");
  CHECK(dsa::tools::omp_env_report() == "OMP_WAIT_POLICY=active GOMP_SPINCOUNT=(unset) (as set by the user)");
  env.set("OMP_WAIT_POLICY", "passive");
  env.set("GOMP_SPINCOUNT", "0");
  env.set("DSA_OMP_ENV", "OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=0 (dsactor launch: 2 ranks on this host, so no spinning)");
  CHECK(dsa::tools::omp_env_report() ==
        "OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=0 (dsactor set OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=0, dsactor "
        "launch: 2 ranks on this host, so no spinning)");
}

TEST_CASE("omp_env: a marker read back") {
  const auto own = dsa::tools::parse_omp_marker("OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=10000 (pid 4242: one rank on this host)");
  CHECK(own.pid == 4242);
  REQUIRE(own.settings.size() == 2);
  CHECK(own.settings[0] == std::pair<std::string, std::string>{"OMP_WAIT_POLICY", "passive"});
  CHECK(own.settings[1] == std::pair<std::string, std::string>{"GOMP_SPINCOUNT", "10000"});
  const auto launcher = dsa::tools::parse_omp_marker("OMP_WAIT_POLICY=passive (dsactor launch: 2 ranks on this host; GOMP_SPINCOUNT is the user's)");
  CHECK(launcher.pid == 0);
  REQUIRE(launcher.settings.size() == 1);
  CHECK(launcher.settings[0].first == "OMP_WAIT_POLICY");
  const auto odd = dsa::tools::parse_omp_marker("X=1 OMP_WAIT_POLICY=active");
  CHECK(odd.pid == 0);
  REQUIRE(odd.settings.size() == 1); // only the OpenMP names count
  CHECK(odd.settings[0].second == "active");
  CHECK(dsa::tools::parse_omp_marker("").settings.empty());
}

TEST_CASE("omp_env: a remote rank's settings from the user's as forwarded") {
  const auto user = dsa::tools::rank_omp_env("active", nullptr, 2);
  CHECK(user.empty());
  const auto spin = dsa::tools::rank_omp_env(nullptr, "77", 2);
  CHECK(value_of(spin, "OMP_WAIT_POLICY") == "passive");
  CHECK(value_of(spin, "GOMP_SPINCOUNT") == "(none)");
  CHECK(value_of(dsa::tools::rank_omp_env(nullptr, nullptr, 1), "GOMP_SPINCOUNT") == dsa::tools::brief_spin);
}
