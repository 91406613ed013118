// What a test program tells the test summary (tools/test_summary.py) beyond doctest's
// counts: the CPU vector paths its cases ran, and the cases that stopped early because this
// CPU lacks a feature. doctest_main.cpp prints both when the run ends, one line each,
// prefixed "[dsactor-test]".
#pragma once

#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

namespace dsa::test {

struct run_notes {
  std::set<std::string> paths_run;
  std::vector<std::string> skipped_for_cpu; // "case name (needs FEATURE)"
  std::string current_case;
};

inline run_notes& notes() {
  static run_notes n;
  return n;
}

inline void note_path_run(const char* path) { notes().paths_run.insert(path); }

// Ends nothing by itself: call it, then return from the case. Prints the skip in the case's
// output and lists it in the program's summary, so a case that cannot run on this CPU is
// never read as having tested something.
inline void skip_for_cpu(const std::string& feature, const std::string& detail = {}) {
  const std::string what = notes().current_case + " (needs " + feature + (detail.empty() ? "" : ": " + detail) + ")";
  notes().skipped_for_cpu.push_back(what);
  MESSAGE("skipped on this CPU: " << what);
}

} // namespace dsa::test
