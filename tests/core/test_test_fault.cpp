// The chaos drill's phase faults (core/test_fault.hpp): each fires in the named phase, at the
// named step or later, in the named process, once per marker; a bad spec names the variable.
#include "core/test_fault.hpp"

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace tf = dsa::test_fault;

// Runs `body` in a child with DSA_TEST_KILL_IN = spec and this process as `process`; the
// signal that ended it (0: it exited).
int ended_by(const std::string& spec, int process, const std::function<void()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("DSA_TEST_KILL_IN", spec.c_str(), 1);
    tf::set_process(process);
    body();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

std::string fresh_marker(const char* name) {
  auto dir = std::filesystem::temp_directory_path() / ("dsa-test-fault-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto marker = (dir / name).string();
  std::filesystem::remove(marker);
  return marker;
}

} // namespace

TEST_CASE("a phase fault kills its process in its phase from its step on, once per marker") {
  const std::string marker = fresh_marker("allreduce");
  const std::string spec = marker + ":1:allreduce:3";
  // Another phase, an earlier step, another process: nothing happens.
  CHECK(ended_by(spec, 1, [] {
          tf::at(tf::phase::forward, 2);
          tf::at(tf::phase::allreduce);
          tf::at(tf::phase::forward, 3);
          tf::at(tf::phase::swap);
        }) == 0);
  CHECK(ended_by(spec, 0, [] {
          tf::at(tf::phase::forward, 4);
          tf::at(tf::phase::allreduce);
        }) == 0);
  CHECK_FALSE(std::filesystem::exists(marker));
  // Step 3's forward began, then an allreduce: killed, the marker left behind.
  CHECK(ended_by(spec, 1, [] {
          tf::at(tf::phase::forward, 3);
          tf::at(tf::phase::allreduce);
        }) == SIGKILL);
  CHECK(std::filesystem::exists(marker));
  // A restarted job runs on.
  CHECK(ended_by(spec, 1, [] {
          tf::at(tf::phase::forward, 5);
          tf::at(tf::phase::allreduce);
        }) == 0);
}

TEST_CASE("a commit fault counts the checkpoint's step, not the forwards'") {
  const std::string marker = fresh_marker("commit");
  const std::string spec = "x:0:forward:99," + marker + ":0:commit:4";
  CHECK(ended_by(spec, 0, [] {
          tf::at(tf::phase::forward, 7);
          tf::at(tf::phase::commit, 2);
        }) == 0);
  CHECK(ended_by(spec, 0, [] { tf::at(tf::phase::commit, 4); }) == SIGKILL);
  std::filesystem::remove_all(std::filesystem::path(marker).parent_path());
}

TEST_CASE("fault specs split at commas, fields from the right: a marker may hold colons") {
  auto specs = tf::split_fault_specs("/a:b/m:1:7,n:0:2", 2);
  REQUIRE(specs.has_value());
  REQUIRE(specs->size() == 2);
  CHECK((*specs)[0] == std::vector<std::string>{"/a:b/m", "1", "7"});
  CHECK((*specs)[1] == std::vector<std::string>{"n", "0", "2"});
  for (const char* bad : {"m:1", ":1:2", "m::2", "m:1:", "m:1:2,"})
    CHECK_FALSE(tf::split_fault_specs(bad, 2).has_value());
}

TEST_CASE("a phase fault spec that does not parse is refused naming the variable") {
  for (const char* bad : {"m:0:backward:1", "m:0:forward", "m:x:forward:1", ":0:forward:1", "m:0:forward:2s"}) {
    ::setenv("DSA_TEST_KILL_IN", bad, 1);
    CHECK_THROWS_WITH_AS(tf::set_process(0), doctest::Contains("DSA_TEST_KILL_IN"), std::runtime_error);
  }
  ::unsetenv("DSA_TEST_KILL_IN");
  CHECK_NOTHROW(tf::set_process(0));
}
