// dsactor prep qa-from-corpus: an extractive QA set in SQuAD v1.1 layout
// (train.json, dev.json) generated from a corpus (io/data/squad_qa_gen.hpp).
#include "io/data/corpus.hpp"
#include "io/data/squad_baselines.hpp"
#include "io/data/squad_qa_gen.hpp"
#include "tools/command.hpp"

#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <filesystem>

namespace dsa::tools {

int prep_qa_from_corpus(int argc, char** argv) {
  namespace po = boost::program_options;
  po::options_description opts("dsactor prep qa-from-corpus --corpus PATH --out DIR [options]");
  opts.add_options()("help,h", "this help")("corpus", po::value<std::string>()->required(),
                                            "Brown corpus directory, text directory or text file")(
      "out", po::value<std::string>()->required(), "output directory for train.json and dev.json")(
      "seed", po::value<std::uint64_t>()->default_value(12345),
      "random seed (same seed, same files)")("dev-fraction",
                                             po::value<double>()->default_value(0.1),
                                             "share of documents in dev.json, in [0, 1)")(
      "max-questions", po::value<std::int64_t>()->default_value(0),
      "at most this many questions (0: no limit)")("questions-per-paragraph",
                                                   po::value<int>()->default_value(2),
                                                   "at most this many per paragraph");
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "prep qa-from-corpus",
                                 "A question is a sentence of the paragraph with one span (name, number, date, place, content\nword) replaced by who/what/when/where/how many; the answer is that span. Prints the trivial\nbaselines (first sentence, random span) on dev.\n"))
    return *done;
  auto bad = [](const char* flag, const std::string& why) {
    fmt::print(stderr, "dsactor prep qa-from-corpus: --{} {}\n", flag, why);
    return 2;
  };
  data::qa_gen_options options;
  options.seed = vm["seed"].as<std::uint64_t>();
  options.dev_fraction = vm["dev-fraction"].as<double>();
  options.max_questions = vm["max-questions"].as<std::int64_t>();
  options.questions_per_paragraph = vm["questions-per-paragraph"].as<int>();
  if (!(options.dev_fraction >= 0.0 && options.dev_fraction < 1.0))
    return bad("dev-fraction", "must be in [0, 1)");
  if (options.max_questions < 0)
    return bad("max-questions", "must be >= 0");
  if (options.questions_per_paragraph < 1)
    return bad("questions-per-paragraph", "must be >= 1");

  const std::string corpus = vm["corpus"].as<std::string>();
  auto docs = data::read_corpus(corpus);
  if (!docs) {
    fmt::print(stderr, "dsactor prep qa-from-corpus: --corpus: {}\n", docs.err().to_string());
    return 1;
  }
  auto qa = data::generate_qa_from_corpus(*docs, options);
  if (!qa) {
    fmt::print(stderr, "dsactor prep qa-from-corpus: --corpus '{}': {}\n", corpus,
               qa.err().to_string());
    return 1;
  }
  const std::string out = vm["out"].as<std::string>();
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec)
    return bad("out", fmt::format("'{}': cannot create: {}", out, ec.message()));
  for (const auto& [name, set] :
       {std::pair{"train.json", &qa->train}, std::pair{"dev.json", &qa->dev}}) {
    std::string path = (std::filesystem::path(out) / name).string();
    if (auto st = data::write_squad(path, *set); !st) {
      fmt::print(stderr, "dsactor prep qa-from-corpus: --out: {}\n", st.err().to_string());
      return 1;
    }
    fmt::print("prep: wrote {} ({} articles, {} questions)\n", path, set->articles.size(),
               set->question_count());
  }
  std::string kinds;
  for (int k = 0; k < 5; ++k)
    kinds += fmt::format("{}{} {}", k ? ", " : "", data::qa_kind_name(k), qa->by_kind[k]);
  fmt::print("prep: questions by kind: {}\n", kinds);
  if (qa->dev.question_count() > 0) {
    auto baselines = data::squad_evaluate_baselines(qa->dev, options.seed);
    if (baselines) {
      fmt::print("prep: dev baseline first-sentence: {}\n",
                 data::squad_scores_json(baselines->first_sentence));
      fmt::print("prep: dev baseline random-span: {}\n",
                 data::squad_scores_json(baselines->random_span));
    }
  }
  return 0;
}

} // namespace dsa::tools
