// dsactor trace RUN_DIR_OR_FILE summary|check|critical-path|actor NAME|diff RUN_B|hang|
// export --chrome FILE|html FILE: inspect the actor trace of a run
// (actors/trace/analysis/trace_summary.hpp, trace_check.hpp, trace_critical_path.hpp,
// trace_views.hpp, trace_hang.hpp, chrome_export.hpp, trace_html.hpp); reads every trace format
// version and traces whose tail a killed run left torn.
#include "actors/trace/analysis/chrome_export.hpp"
#include "actors/trace/analysis/trace_check.hpp"
#include "actors/trace/analysis/trace_clock.hpp"
#include "actors/trace/analysis/trace_critical_path.hpp"
#include "actors/trace/analysis/trace_hang.hpp"
#include "actors/trace/analysis/trace_html.hpp"
#include "actors/trace/analysis/trace_summary.hpp"
#include "actors/trace/analysis/trace_views.hpp"
#include "actors/trace/analysis/trace_swap_io.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <filesystem>
#include <optional>

namespace dsa::tools {

namespace {

// The trace of rank `rank` among a run's traces, or an error naming the ranks there.
expected<const actors::rank_trace*> rank_of(const std::vector<actors::rank_trace>& traces, std::uint32_t rank) {
  std::string ranks;
  for (const auto& t : traces) {
    if (t.rank == rank) return &t;
    ranks += fmt::format("{}{}", ranks.empty() ? "" : ", ", t.rank);
  }
  return make_error(errc::not_found, "--rank {}: the run has traces of rank(s) {}", rank, ranks);
}

int fail(const error& e) {
  fmt::print(stderr, "dsactor trace: {}\n", e.to_string());
  return 1;
}

} // namespace

int cmd_trace(int argc, char** argv) {
  po::options_description opts(
      "dsactor trace RUN_DIR_OR_FILE summary|check|critical-path --step K|actor NAME|diff RUN_B|hang|"
      "export --chrome FILE|html FILE (also: dsactor trace hang RUN)");
  opts.add_options()("help,h", "this help")(
      "path", po::value<std::string>(),
      "a run directory (its trace.dsat and trace.rank<r>.dsat) or one .dsat file")(
      "what", po::value<std::string>()->default_value("summary"),
      "summary: per actor and per step, where time went and what bounds the step (--steps: every step's row); check: verify the schedule's invariants "
      "(exit 1 naming the first violation); critical-path: the spans and messages that set step K's "
      "end; actor NAME: one actor's spans, messages and waits; diff RUN_B: where two runs' schedules "
      "first differ and how step times changed; hang: where a hang began, from the flight records the "
      "processes wrote (the first collective or pipeline edge where the ranks diverge); export --chrome FILE: Chrome/Perfetto trace-event JSON; "
      "html FILE: one self-contained page with a zoomable timeline and the summary")(
      "arg", po::value<std::string>(), "actor: the actor's name; diff: the other run; html: the page to write")(
      "step", po::value<std::uint32_t>(), "critical-path: the step (required); actor: only this step")(
      "rank", po::value<std::uint32_t>()->default_value(0), "critical-path, actor: the rank's trace")(
      "steps", "summary: every step's row instead of the step-time distribution")(
      "last", "hang: each process's last flight record instead of its first")(
      "chrome", po::value<std::string>(), "export: the JSON file to write (every rank's trace, a process each)")(
      "idle-tolerance-ms", po::value<double>()->default_value(200),
      "check: how long a stage may take to start a runnable span before idling counts as starvation");
  po::positional_options_description pos;
  pos.add("path", 1).add("what", 1).add("arg", 1);
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "trace", "", &pos))
    return *done;
  if (!vm.count("path")) {
    fmt::print(stderr, "dsactor trace: a run directory or trace file is required\n{}",
               fmt::to_string(fmt::streamed(opts)));
    return 2;
  }
  auto what = vm["what"].as<std::string>();
  std::string path = vm["path"].as<std::string>();
  // dsactor trace hang RUN (unless a run directory is named hang)
  if (path == "hang" && !vm["what"].defaulted() && !std::filesystem::exists(path)) std::swap(path, what);
  if (what != "summary" && what != "check" && what != "critical-path" && what != "actor" && what != "diff" &&
      what != "export" && what != "html" && what != "hang") {
    fmt::print(stderr,
               "dsactor trace: unknown view '{}' (known: summary, check, critical-path, actor, diff, hang, export, "
               "html)\n",
               what);
    return 2;
  }
  if (what == "export" && !vm.count("chrome")) {
    fmt::print(stderr, "dsactor trace: export needs --chrome FILE (the only format so far)\n");
    return 2;
  }
  if ((what == "actor" || what == "diff" || what == "html") && !vm.count("arg")) {
    fmt::print(stderr, "dsactor trace: '{}' needs {}\n", what,
               what == "actor"  ? "an actor's name: dsactor trace RUN actor NAME"
               : what == "diff" ? "a second run: dsactor trace RUN_A diff RUN_B"
                                : "the page to write: dsactor trace RUN html FILE");
    return 2;
  }
  if (!(vm["idle-tolerance-ms"].as<double>() >= 0)) {
    fmt::print(stderr, "dsactor trace: --idle-tolerance-ms must be 0 or more, not {}\n",
               vm["idle-tolerance-ms"].as<double>());
    return 2;
  }
  if (what == "critical-path" && !vm.count("step")) {
    fmt::print(stderr, "dsactor trace: critical-path needs --step K\n");
    return 2;
  }
  if (what == "hang") { // every process's own file: the flight records are per process
    auto files = actors::load_run_traces(path, false);
    if (!files) return fail(files.err());
    auto inputs = actors::hang_inputs(*files, vm.count("last") > 0);
    if (!inputs) return fail(inputs.err());
    fmt::print("{}", actors::format_hang(actors::analyse_hang(*inputs)));
    return 0;
  }
  auto traces = actors::load_run_traces(path);
  if (!traces)
    return fail(traces.err());
  if (what == "check") {
    actors::trace_check_options check_options;
    check_options.idle_tolerance_ms = vm["idle-tolerance-ms"].as<double>();
    const auto result = actors::check_traces(*traces, check_options);
    fmt::print("{}", actors::format_trace_check(result));
    return result.first ? 1 : 0;
  }
  if (what == "export") {
    const auto file = vm["chrome"].as<std::string>();
    if (auto w = actors::write_chrome_trace(file, *traces); !w)
      return fail(w.err());
    fmt::print("wrote {} (open it in https://ui.perfetto.dev or chrome://tracing)\n", file);
    return 0;
  }
  if (what == "html") {
    const auto file = vm["arg"].as<std::string>();
    if (auto w = actors::write_trace_html(file, *traces, path); !w)
      return fail(w.err());
    fmt::print("wrote {} (open it in a browser; it needs no network)\n", file);
    return 0;
  }
  if (what == "diff") {
    auto other = actors::load_run_traces(vm["arg"].as<std::string>());
    if (!other)
      return fail(other.err());
    fmt::print("A: {}\nB: {}\n{}", path, vm["arg"].as<std::string>(),
               actors::format_run_difference(actors::diff_runs(*traces, *other)));
    return 0;
  }
  if (what == "summary") {
    actors::summary_format format;
    format.per_step = vm.count("steps") > 0;
    format.before_verdict = actors::format_swap_io(actors::summarize_swap_io(*traces));
    fmt::print("{}", actors::format_trace_summary(actors::summarize_traces(*traces), format));
    return 0;
  }
  auto rank = rank_of(*traces, vm["rank"].as<std::uint32_t>());
  if (!rank)
    return fail(rank.err());
  // The rank's times on the common clock, as the summary's and the html's.
  const auto clocks = actors::align_trace_clocks(*traces);
  const auto at = static_cast<std::size_t>(*rank - traces->data());
  const actors::trace_data trace = actors::shifted_trace((*rank)->trace, clocks.offset_ns.at(at));
  if (what == "critical-path") {
    auto path = actors::find_critical_path(trace, (*rank)->rank, vm["step"].as<std::uint32_t>());
    if (!path)
      return fail(path.err());
    fmt::print("{}", actors::format_critical_path(trace, *path));
    return 0;
  }
  auto actor = actors::find_trace_actor(trace, vm["arg"].as<std::string>());
  if (!actor)
    return fail(actor.err());
  std::optional<std::uint32_t> step;
  if (vm.count("step"))
    step = vm["step"].as<std::uint32_t>();
  fmt::print("{}", actors::format_actor_view(trace, *actor, step));
  return 0;
}

} // namespace dsa::tools
