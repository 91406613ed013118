// dsactor eval: scores predictions. "squad" computes SQuAD v1.1 exact match
// and F1 as the official evaluate-v1.1 script and ends with its result object.
#include "io/data/squad_dataset.hpp"
#include "io/data/squad_eval.hpp"
#include "tools/command.hpp"

#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <cstring>

namespace dsa::tools {
namespace {

namespace po = boost::program_options;

int eval_squad(int argc, char** argv) {
  po::options_description opts("dsactor eval squad --data dev.json --predictions predictions.json");
  opts.add_options()("help,h", "this help")("data", po::value<std::string>()->required(),
                                            "SQuAD v1.1 data set (dev-v1.1.json layout)")(
      "predictions", po::value<std::string>()->required(),
      "predictions.json: {question id: answer text}");
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "eval squad",
                                 "Prints {\"exact_match\": ..., \"f1\": ...} as its last line, as evaluate-v1.1.py does.\n"))
    return *done;
  auto dataset = data::load_squad(vm["data"].as<std::string>(), data::squad_fields::scored);
  if (!dataset) {
    fmt::print(stderr, "dsactor eval squad: --data: {}\n", dataset.err().to_string());
    return 1;
  }
  if (dataset->version != "1.1")
    fmt::print(stderr, "Evaluation expects v-1.1, but got dataset with v-{}\n", dataset->version);
  auto predictions = data::load_squad_predictions(vm["predictions"].as<std::string>());
  if (!predictions) {
    fmt::print(stderr, "dsactor eval squad: --predictions: {}\n", predictions.err().to_string());
    return 1;
  }
  auto scores = data::squad_evaluate(*dataset, *predictions);
  if (!scores) {
    fmt::print(stderr, "dsactor eval squad: --data: {}\n", scores.err().to_string());
    return 1;
  }
  for (const auto& id : scores->unanswered)
    fmt::print(stderr, "Unanswered question {} will receive score 0.\n", id);
  std::fflush(stderr);
  fmt::print("{}\n", data::squad_scores_json(*scores));
  return 0;
}

} // namespace

int cmd_eval(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    fmt::print("usage: dsactor eval WHAT [options]\n"
               "  squad   SQuAD v1.1 exact match and F1 ('dsactor eval squad --help')\n");
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "squad"))
    return eval_squad(argc - 1, argv + 1);
  fmt::print(stderr, "dsactor eval: unknown task '{}' (expected 'squad')\n", argv[1]);
  return 2;
}

} // namespace dsa::tools
