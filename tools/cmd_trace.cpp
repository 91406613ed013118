// dsactor trace RUN_DIR_OR_FILE summary|check: inspect the actor trace of a run
// (actors/trace/trace_summary.hpp, trace_check.hpp); reads every trace format
// version and traces whose tail a killed run left torn.
#include "actors/trace/trace_check.hpp"
#include "actors/trace/trace_summary.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"

#include <fmt/format.h>
#include <fmt/ostream.h>

namespace dsa::tools {

int cmd_trace(int argc, char** argv) {
  po::options_description opts("dsactor trace RUN_DIR_OR_FILE summary|check");
  opts.add_options()("help,h", "this help")(
      "path", po::value<std::string>(),
      "a run directory (its trace.dsat and trace.rank<r>.dsat) or one .dsat file")(
      "what", po::value<std::string>()->default_value("summary"),
      "summary: per actor and per step, where time went; check: verify the schedule's invariants "
      "(exit 1 naming the first violation)");
  po::positional_options_description pos;
  pos.add("path", 1).add("what", 1);
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "trace", "", &pos))
    return *done;
  if (!vm.count("path")) {
    fmt::print(stderr, "dsactor trace: a run directory or trace file is required\n{}",
               fmt::to_string(fmt::streamed(opts)));
    return 2;
  }
  const auto what = vm["what"].as<std::string>();
  if (what != "summary" && what != "check") {
    fmt::print(stderr, "dsactor trace: unknown view '{}' (known: summary, check)\n", what);
    return 2;
  }
  auto traces = actors::load_run_traces(vm["path"].as<std::string>());
  if (!traces) {
    fmt::print(stderr, "dsactor trace: {}\n", traces.err().to_string());
    return 1;
  }
  if (what == "check") {
    const auto result = actors::check_traces(*traces);
    fmt::print("{}", actors::format_trace_check(result));
    return result.first ? 1 : 0;
  }
  fmt::print("{}", actors::format_trace_summary(actors::summarize_traces(*traces)));
  return 0;
}

} // namespace dsa::tools
