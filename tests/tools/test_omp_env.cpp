// The OpenMP settings dsactor chooses for itself (tools/omp_env.cpp), compiled in.
#include "tools/omp_env.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

using dsa::tools::choose_omp_env;

TEST_CASE("omp_env: alone on the host, passive with a brief spin") {
  const auto c = choose_omp_env(nullptr, nullptr, nullptr, 1);
  CHECK(c.changes());
  CHECK(c.wait_policy == "passive");
  CHECK(c.spincount == dsa::tools::brief_spin);
}

TEST_CASE("omp_env: several ranks on the host never spin") {
  const auto c = choose_omp_env(nullptr, nullptr, nullptr, 2);
  CHECK(c.wait_policy == "passive");
  CHECK(c.spincount == "0");
}

TEST_CASE("omp_env: the user's settings stand") {
  CHECK_FALSE(choose_omp_env("active", nullptr, nullptr, 1).changes());
  CHECK_FALSE(choose_omp_env("passive", "5", nullptr, 4).changes());
  // A user's spin count alone: passive is still chosen, the spin count is left.
  const auto c = choose_omp_env(nullptr, "123", nullptr, 1);
  CHECK(c.wait_policy == "passive");
  CHECK(c.spincount.empty());
}

TEST_CASE("omp_env: an image already chosen for is not changed again (no re-exec loop)") {
  CHECK_FALSE(choose_omp_env(nullptr, nullptr, "OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=10000", 1).changes());
}

namespace {

// Sets or unsets environment variables for one test and restores them after.
struct scoped_env {
  struct saved {
    std::string name;
    bool was_set;
    std::string value;
  };
  std::vector<saved> old;
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

} // namespace

TEST_CASE("omp_env: local rank count from the launchers' variables") {
  scoped_env env;
  env.set("LOCAL_SIZE", nullptr);
  env.set("LOCAL_WORLD_SIZE", nullptr);
  env.set("OMPI_COMM_WORLD_LOCAL_SIZE", nullptr);
  CHECK(dsa::tools::local_ranks_from_environment() == 1);
  env.set("OMPI_COMM_WORLD_LOCAL_SIZE", "3");
  CHECK(dsa::tools::local_ranks_from_environment() == 3);
  env.set("LOCAL_SIZE", "2");
  CHECK(dsa::tools::local_ranks_from_environment() == 2); // dsactor launch's own first
  env.set("LOCAL_SIZE", "two");
  CHECK(dsa::tools::local_ranks_from_environment() == 3); // unreadable: the next one
  env.set("LOCAL_SIZE", "0");
  env.set("OMPI_COMM_WORLD_LOCAL_SIZE", nullptr);
  CHECK(dsa::tools::local_ranks_from_environment() == 1);
}

TEST_CASE("omp_env: a launcher passes on only what the user set") {
  scoped_env env;
  env.set("DSA_OMP_ENV", nullptr);
  CHECK_FALSE(dsa::tools::chosen_for_this_process("OMP_WAIT_POLICY"));
  CHECK_FALSE(dsa::tools::chosen_for_this_process("GOMP_SPINCOUNT"));
  env.set("DSA_OMP_ENV", "OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=10000");
  CHECK(dsa::tools::chosen_for_this_process("OMP_WAIT_POLICY"));
  CHECK(dsa::tools::chosen_for_this_process("GOMP_SPINCOUNT"));
  CHECK(dsa::tools::chosen_for_this_process("DSA_OMP_ENV"));
  CHECK_FALSE(dsa::tools::chosen_for_this_process("OMP_NUM_THREADS"));
  env.set("DSA_OMP_ENV", "OMP_WAIT_POLICY=passive"); // the user had set GOMP_SPINCOUNT
  CHECK(dsa::tools::chosen_for_this_process("OMP_WAIT_POLICY"));
  CHECK_FALSE(dsa::tools::chosen_for_this_process("GOMP_SPINCOUNT"));
}
