// The one doctest main for every test program. Besides doctest's own report it prints, as
// "[dsactor-test]" lines the test summary reads: the CPU vector paths the cases ran, the
// cases skipped because this CPU lacks a feature, and, when a case crashes the program,
// every case that did not run because of it.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "tests/support/run_notes.hpp"

#include <cstdio>

namespace {

std::string case_key(const char* file, int line, const char* name) {
  return std::string(file) + ":" + std::to_string(line) + ":" + name;
}

// A listener: doctest calls it before its reporters, also from its fatal-signal handler.
struct notes_listener : doctest::IReporter {
  explicit notes_listener(const doctest::ContextOptions&) {}

  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_case_start(const doctest::TestCaseData& tc) override {
    dsa::test::notes().current_case = tc.m_name;
    seen_.insert(case_key(tc.m_file.c_str(), tc.m_line, tc.m_name));
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats& stats) override {
    if (stats.failure_flags & doctest::TestCaseFailureReason::Crash) crashed_ = dsa::test::notes().current_case;
  }
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData& tc) override {
    seen_.insert(case_key(tc.m_file.c_str(), tc.m_line, tc.m_name));
  }

  void test_run_end(const doctest::TestRunStats&) override {
    const auto& notes = dsa::test::notes();
    if (!notes.paths_run.empty()) {
      std::string paths;
      for (const auto& p : notes.paths_run) paths += (paths.empty() ? "" : " ") + p;
      std::printf("[dsactor-test] vector paths run: %s\n", paths.c_str());
    }
    for (const auto& s : notes.skipped_for_cpu) std::printf("[dsactor-test] skipped on this CPU: %s\n", s.c_str());
    if (!crashed_.empty()) {
      std::printf("[dsactor-test] crashed in: %s\n", crashed_.c_str());
      for (const auto& tc : doctest::detail::getRegisteredTests())
        if (!seen_.count(case_key(tc.m_file.c_str(), tc.m_line, tc.m_name)))
          std::printf("[dsactor-test] did not run: %s\n", tc.m_name);
    }
    std::fflush(stdout);
  }

 private:
  std::set<std::string> seen_;
  std::string crashed_;
};

} // namespace

DOCTEST_REGISTER_LISTENER("dsactor_notes", 1, notes_listener);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  return context.run();
}
