// dsactor run CONFIG: train or fine-tune BERT as configured (see actors/train/run/trainer.hpp).
#include "actors/train/run/trainer.hpp"
#include "tools/command.hpp"

#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <fmt/ostream.h>

namespace dsa::tools {

int cmd_run(int argc, char** argv) {
  namespace po = boost::program_options;
  po::options_description opts("dsactor run CONFIG [options]");
  opts.add_options()("help,h", "this help")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a config key: --set key=value (repeatable)")(
      "resume", "continue from the latest checkpoint in checkpoint.dir")(
      "resume-if-any", "continue from the latest checkpoint when checkpoint.dir has one, else start afresh "
                       "(what dsactor launch --max_restarts gives a restarted job)")(
      "deepspeed_config", po::value<std::string>(), "a DeepSpeed JSON config under the TOML one")(
      "trace-chrome", po::value<std::string>(), "also export the actor trace as Chrome trace-event JSON")(
      "config", po::value<std::string>(), "the run's TOML config");
  po::positional_options_description pos;
  pos.add("config", 1);
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "run", "", &pos)) return *done;
  if (!vm.count("config")) {
    fmt::print(stderr, "dsactor run: a config file is required\n{}", fmt::to_string(fmt::streamed(opts)));
    return 2;
  }
  train::run_request r;
  r.config_path = vm["config"].as<std::string>();
  if (vm.count("set")) r.overrides = vm["set"].as<std::vector<std::string>>();
  if (vm.count("deepspeed_config")) r.deepspeed_config = vm["deepspeed_config"].as<std::string>();
  if (vm.count("trace-chrome")) r.trace_chrome = vm["trace-chrome"].as<std::string>();
  r.resume = vm.count("resume") > 0;
  r.resume_if_any = vm.count("resume-if-any") > 0;
  return train::run_training(r);
}

} // namespace dsa::tools
