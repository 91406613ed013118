// dsactor vocab build: learns a WordPiece vocabulary (vocab.txt) from a corpus.
#include "io/ckpt/atomic_file.hpp"
#include "io/data/corpus.hpp"
#include "models/tokenizer/vocab_builder.hpp"
#include "tools/command.hpp"

#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <chrono>
#include <cstring>

namespace dsa::tools {
namespace {

namespace po = boost::program_options;

int vocab_build(int argc, char** argv) {
  po::options_description opts(
      "dsactor vocab build --corpus PATH --size N --out vocab.txt [options]");
  opts.add_options()("help,h", "this help")("corpus", po::value<std::string>()->required(),
                                            "Brown corpus directory, text directory or text file")(
      "size", po::value<int>()->required(), "vocabulary size, special tokens included")(
      "out", po::value<std::string>()->required(), "vocab.txt to write (atomically)")(
      "cased", "keep case and accents (default: lower-case and strip accents)")(
      "unused", po::value<int>()->default_value(10), "number of [unusedK] slots after [PAD]")(
      "min-pair-count", po::value<std::int64_t>()->default_value(2),
      "stop merging below this pair count")(
      "block-mb", po::value<double>()->default_value(64),
      "MB of corpus text read at a time (the word counts add up: the vocabulary does not change)");
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "vocab build",
                                 "Learns WordPiece pieces by greedy pair merges (see models/tokenizer/vocab_builder.hpp).\n"))
    return *done;
  tok::vocab_build_options options;
  options.size = vm["size"].as<int>();
  options.unused_tokens = vm["unused"].as<int>();
  options.min_pair_count = vm["min-pair-count"].as<std::int64_t>();
  const int specials = static_cast<int>(tok::special_tokens(options.unused_tokens).size());
  if (options.unused_tokens < 0 || options.size <= specials) {
    fmt::print(stderr,
               "dsactor vocab build: --size {} must exceed the {} special tokens (--unused {})\n",
               options.size, specials, options.unused_tokens);
    return 2;
  }
  tok::tokenizer_options tokenizer;
  if (vm.count("cased"))
    tokenizer.case_mode = tok::casing::keep;

  const double block_mb = vm["block-mb"].as<double>();
  if (!(block_mb > 0 && block_mb <= 1 << 20)) {
    fmt::print(stderr, "dsactor vocab build: --block-mb must be in (0, 1048576]\n");
    return 2;
  }

  const std::string corpus = vm["corpus"].as<std::string>();
  auto start = std::chrono::steady_clock::now();
  // The corpus a block at a time: memory holds one block's text and the word counts.
  tok::word_counter counter(tokenizer);
  std::size_t documents = 0, sentences = 0;
  int blocks = 0;
  const auto read = data::for_each_document_block(
      corpus, static_cast<std::size_t>(block_mb * 1024 * 1024), [&](std::vector<data::document>&& docs) -> status {
        for (const auto& d : docs)
          for (const auto& p : d.paragraphs)
            for (const auto& s : p.sentences) {
              counter.add_text(s);
              ++sentences;
            }
        documents += docs.size();
        ++blocks;
        fmt::print("vocab: block {}: {} documents, {} distinct words so far\n", blocks, documents,
                   counter.counts().size());
        std::fflush(stdout);
        return {};
      });
  if (!read) {
    fmt::print(stderr, "dsactor vocab build: --corpus: {}\n", read.err().to_string());
    return 1;
  }
  fmt::print("vocab: {} documents, {} sentences, {} distinct words from {}\n", documents, sentences,
             counter.counts().size(), corpus);
  options.progress = [&](std::int64_t merges, std::int64_t size) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print("vocab: {} merges, {} / {} tokens, {:.1f} s\n", merges, size, options.size, s);
    std::fflush(stdout);
  };
  auto tokens = tok::build_wordpiece_vocab(counter.counts(), options);
  std::string text;
  for (const auto& t : tokens)
    text += t + "\n";
  const std::string out = vm["out"].as<std::string>();
  if (auto st = ckpt::write_file_atomic(out, text); !st) {
    fmt::print(stderr, "dsactor vocab build: --out: {}\n", st.err().to_string());
    return 1;
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("vocab: wrote {} tokens to {} ({:.1f} s){}\n", tokens.size(), out, s,
             static_cast<int>(tokens.size()) < options.size
                 ? " (no pair left to merge: smaller than --size)"
                 : "");
  return 0;
}

} // namespace

int cmd_vocab(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    fmt::print(
        "usage: dsactor vocab build --corpus PATH --size N --out vocab.txt [--cased --block-mb 64]\n"
        "  build   learn a WordPiece vocabulary from a corpus ('dsactor vocab build --help')\n");
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "build"))
    return vocab_build(argc - 1, argv + 1);
  fmt::print(stderr, "dsactor vocab: unknown action '{}' (expected 'build')\n", argv[1]);
  return 2;
}

} // namespace dsa::tools
