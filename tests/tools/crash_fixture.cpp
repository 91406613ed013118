// A doctest program that aborts in its second of four cases, for test_summary_check.py:
// the summary must count the crash and name the two cases that never ran.
#include "tests/support/run_notes.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>

TEST_CASE("fixture: first case passes") {
  const char* text = "a const char* printed as its text";
  MESSAGE("message: " << text);
  CHECK(1 + 1 == 2);
}

TEST_CASE("fixture: second case aborts") {
  dsa::test::note_path_run("scalar");
  if (std::getenv("DSA_FIXTURE_NO_CRASH") == nullptr) std::abort();
}

TEST_CASE("fixture: third case never runs") { CHECK(true); }

TEST_CASE("fixture: fourth case never runs") {
  dsa::test::skip_for_cpu("a feature no CPU has");
}
