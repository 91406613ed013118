// dsactor prep: data preparation. "pretrain" turns a corpus into BERT
// pre-training shards (io/data/pretrain_shard.hpp), "synthetic" writes shards of random
// instances (io/data/synthetic_shards.hpp); "qa-from-corpus" lives in cmd_prep_qa.cpp.
#include "io/data/corpus.hpp"
#include "io/data/pretrain_builder.hpp"
#include "io/data/pretrain_rng.hpp"
#include "io/data/pretrain_shard.hpp"
#include "io/data/synthetic_shards.hpp"
#include "tools/command.hpp"

#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <chrono>
#include <cstring>
#include <filesystem>

namespace dsa::tools {
namespace {

namespace po = boost::program_options;

struct stopwatch {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

// Writes instances as shards "<dir>/<prefix>-NNNNN.safetensors" numbered from `first`;
// returns the count written or -1.
int write_shards(const std::string& dir, const std::string& prefix,
                 const std::vector<data::pretrain_instance>& all, std::size_t shard_size,
                 const data::shard_layout& layout, const ckpt::metadata_map& meta,
                 const stopwatch& clock, int first = 0) {
  int shards = 0;
  for (std::size_t begin = 0; begin < all.size(); begin += shard_size, ++shards) {
    std::size_t end = std::min(all.size(), begin + shard_size);
    std::string path =
        data::shard_file_name((std::filesystem::path(dir) / prefix).string(), first + shards);
    if (auto st = data::write_pretrain_shard(path, all, begin, end, layout, meta); !st) {
      fmt::print(stderr, "dsactor prep pretrain: --out: {}\n", st.err().to_string());
      return -1;
    }
    fmt::print("prep: wrote {} ({} instances, {:.1f} s)\n", path, end - begin, clock.seconds());
    std::fflush(stdout);
  }
  return shards;
}

void print_stats(const char* name, const std::vector<data::pretrain_instance>& all) {
  std::int64_t tokens = 0, masked = 0, random_next = 0;
  for (const auto& i : all) {
    tokens += static_cast<std::int64_t>(i.input_ids.size());
    masked += static_cast<std::int64_t>(i.masked_lm_positions.size());
    random_next += i.next_sentence_label;
  }
  double n = all.empty() ? 1.0 : static_cast<double>(all.size());
  fmt::print(
      "prep: {}: {} instances, mean length {:.1f}, mean masked {:.1f}, random next {:.1f}%\n", name,
      all.size(), tokens / n, masked / n, 100.0 * random_next / n);
}

int prep_pretrain(int argc, char** argv) {
  po::options_description opts(
      "dsactor prep pretrain --corpus PATH --vocab vocab.txt --out DIR [options]");
  opts.add_options()("help,h", "this help")("corpus", po::value<std::string>()->required(),
                                            "Brown corpus directory, text directory or text file")(
      "vocab", po::value<std::string>()->required(),
      "vocab.txt")("out", po::value<std::string>()->required(), "output directory for the shards")(
      "seq", po::value<int>()->default_value(128), "max_seq_length (128 and 512 are BERT's)")(
      "dupe-factor", po::value<int>()->default_value(5),
      "passes over the documents with different masks")("short-seq-prob",
                                                        po::value<double>()->default_value(0.1),
                                                        "probability of a shorter target length")(
      "masked-lm-prob", po::value<double>()->default_value(0.15),
      "masked LM probability")("max-predictions", po::value<int>()->default_value(20),
                               "max_predictions_per_seq")("whole-word", "whole-word masking")(
      "cased", "keep case and accents (must match the vocabulary)")(
      "seed", po::value<std::uint64_t>()->default_value(12345),
      "random seed")("holdout-docs", po::value<std::int64_t>()->default_value(0),
                     "documents held out into holdout-*.safetensors")(
      "shard-size", po::value<std::int64_t>()->default_value(10000), "instances per shard")(
      "block-mb", po::value<double>()->default_value(64),
      "corpus text read, tokenized and turned into instances at a time (whole documents; the random\n"
      "next segments come from the same block; --holdout-docs from the first)");
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "prep pretrain",
                                 "Writes <out>/train-NNNNN.safetensors (and holdout-NNNNN); format in io/data/pretrain_shard.hpp.\n"))
    return *done;
  data::pretrain_options options;
  options.max_seq_length = vm["seq"].as<int>();
  options.dupe_factor = vm["dupe-factor"].as<int>();
  options.short_seq_prob = vm["short-seq-prob"].as<double>();
  options.masking.masked_lm_prob = vm["masked-lm-prob"].as<double>();
  options.masking.max_predictions = vm["max-predictions"].as<int>();
  options.masking.mode =
      vm.count("whole-word") ? data::word_masking::whole_word : data::word_masking::per_token;
  options.seed = vm["seed"].as<std::uint64_t>();
  const std::int64_t holdout = vm["holdout-docs"].as<std::int64_t>();
  const std::int64_t shard_size = vm["shard-size"].as<std::int64_t>();
  auto bad = [](const char* flag, const std::string& why) {
    fmt::print(stderr, "dsactor prep pretrain: --{} {}\n", flag, why);
    return 2;
  };
  if (options.max_seq_length < 8 || options.max_seq_length > 8192)
    return bad("seq", "must be in [8, 8192]");
  if (options.dupe_factor < 1)
    return bad("dupe-factor", "must be >= 1");
  if (!(options.short_seq_prob >= 0 && options.short_seq_prob <= 1))
    return bad("short-seq-prob", "must be in [0, 1]");
  if (!(options.masking.masked_lm_prob > 0 && options.masking.masked_lm_prob < 1))
    return bad("masked-lm-prob", "must be in (0, 1)");
  if (options.masking.max_predictions < 1 ||
      options.masking.max_predictions > options.max_seq_length)
    return bad("max-predictions", "must be in [1, --seq]");
  if (holdout < 0)
    return bad("holdout-docs", "must be >= 0");
  if (shard_size < 1)
    return bad("shard-size", "must be >= 1");
  const double block_mb = vm["block-mb"].as<double>();
  if (!(block_mb > 0 && block_mb <= 1 << 20))
    return bad("block-mb", "must be in (0, 1048576]");

  stopwatch clock;
  auto v = tok::vocab::load(vm["vocab"].as<std::string>());
  if (!v) {
    fmt::print(stderr, "dsactor prep pretrain: --vocab: {}\n", v.err().to_string());
    return 1;
  }
  for (const char* special : {"[CLS]", "[SEP]", "[MASK]", "[PAD]"})
    if (!v->contains(special))
      return bad("vocab", fmt::format("has no {} token", special));
  const std::string corpus = vm["corpus"].as<std::string>();
  tok::tokenizer_options tokenizer_options;
  if (vm.count("cased"))
    tokenizer_options.case_mode = tok::casing::keep;
  const data::masking_vocab masking_vocab = data::masking_vocab::from(*v);
  tok::bert_tokenizer tokenizer(std::move(*v), tokenizer_options);
  const std::string out = vm["out"].as<std::string>();
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec)
    return bad("out", fmt::format("'{}': cannot create: {}", out, ec.message()));
  const data::shard_layout layout{options.max_seq_length, options.masking.max_predictions,
                                  tokenizer.vocabulary().size(),
                                  data::shard_vocab_of(tokenizer.vocabulary())};
  ckpt::metadata_map meta{{"seed", std::to_string(options.seed)},
                          {"dupe_factor", std::to_string(options.dupe_factor)},
                          {"short_seq_prob", fmt::format("{}", options.short_seq_prob)},
                          {"masked_lm_prob", fmt::format("{}", options.masking.masked_lm_prob)},
                          {"whole_word", vm.count("whole-word") ? "1" : "0"},
                          {"cased", vm.count("cased") ? "1" : "0"}};
  // The corpus a block at a time: its documents, their tokens and instances are in memory
  // only while the block's shards are written. The first block uses --seed itself, so a
  // corpus of one block gives the shards it always gave.
  int train_shards = 0, blocks = 0;
  std::vector<data::tokenized_document> holdout_docs;
  std::string refused;
  const auto read = data::for_each_document_block(
      corpus, static_cast<std::size_t>(block_mb * 1024 * 1024), [&](std::vector<data::document>&& docs) -> status {
        auto tokenized = data::tokenize_documents(docs, tokenizer);
        fmt::print("prep: block {}: {} documents from {} tokenized ({:.1f} s)\n", blocks, tokenized.size(), corpus,
                   clock.seconds());
        docs.clear();
        docs.shrink_to_fit();
        if (blocks == 0 && holdout > 0) {
          if (holdout >= static_cast<std::int64_t>(tokenized.size())) {
            refused = fmt::format("{} leaves no training documents of the first block's {} (raise --block-mb)",
                                  holdout, tokenized.size());
            return make_error(errc::invalid_argument, "{}", refused);
          }
          auto [train_docs, held] = data::split_holdout(std::move(tokenized), holdout, options.seed);
          tokenized = std::move(train_docs);
          holdout_docs = std::move(held);
        }
        data::pretrain_options block_options = options;
        if (blocks > 0) block_options.seed = data::derive_seed(options.seed, 0x626c6f636bull, static_cast<std::uint64_t>(blocks));
        const std::int64_t report_every = std::max<std::int64_t>(1, static_cast<std::int64_t>(tokenized.size()) / 4);
        block_options.progress = [&](std::int64_t done, std::int64_t total) {
          if (done % report_every == 0 || done == total) {
            fmt::print("prep: instances: {} / {} document passes ({:.1f} s)\n", done, total, clock.seconds());
            std::fflush(stdout);
          }
        };
        auto train = data::create_pretraining_instances(std::move(tokenized), masking_vocab, block_options);
        print_stats("train", train);
        const int written = write_shards(out, "train", train, static_cast<std::size_t>(shard_size), layout, meta,
                                         clock, train_shards);
        if (written < 0) return make_error(errc::io, "writing the shards of block {}", blocks);
        train_shards += written;
        ++blocks;
        return {};
      });
  if (!read) {
    if (!refused.empty()) return bad("holdout-docs", refused);
    fmt::print(stderr, "dsactor prep pretrain: --corpus: {}\n", read.err().to_string());
    return 1;
  }
  int holdout_shards = 0;
  if (!holdout_docs.empty()) {
    data::pretrain_options held = options;
    held.dupe_factor = 1;
    held.seed = data::derive_seed(options.seed, 0x686f6c646f7574ull);
    held.progress = nullptr;
    auto instances =
        data::create_pretraining_instances(std::move(holdout_docs), masking_vocab, held);
    print_stats("holdout", instances);
    meta["dupe_factor"] = "1";
    holdout_shards = write_shards(out, "holdout", instances, static_cast<std::size_t>(shard_size),
                                  layout, meta, clock);
    if (holdout_shards < 0)
      return 1;
  }
  fmt::print("prep: done: {} train shard(s), {} holdout shard(s) in {} ({:.1f} s)\n", train_shards,
             holdout_shards, out, clock.seconds());
  return 0;
}

int prep_synthetic(int argc, char** argv) {
  po::options_description opts("dsactor prep synthetic --out DIR --instances N [options]");
  opts.add_options()("help,h", "this help")("out", po::value<std::string>()->required(),
                                            "output directory for vocab.txt and the shards")(
      "instances", po::value<std::int64_t>()->required(), "instances in all")(
      "seq", po::value<int>()->default_value(128), "max_seq_length")(
      "max-predictions", po::value<int>()->default_value(20), "max_predictions_per_seq")(
      "vocab-size", po::value<std::int32_t>()->default_value(1000), "tokens in vocab.txt (5 special, the rest words)")(
      "shard-size", po::value<std::int64_t>()->default_value(10000), "instances per shard")(
      "seed", po::value<std::uint64_t>()->default_value(1), "random seed (same seed, same files)");
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "prep synthetic",
                                "Random instances in the pre-training shard format, one shard in memory at a time: data\n"
                                "sets larger than memory without a corpus (benchmarks, tests of the reader).\n"))
    return *done;
  data::synthetic_shard_options o;
  o.instances = vm["instances"].as<std::int64_t>();
  o.per_shard = vm["shard-size"].as<std::int64_t>();
  o.seq_length = vm["seq"].as<int>();
  o.max_predictions = vm["max-predictions"].as<int>();
  o.vocab_size = vm["vocab-size"].as<std::int32_t>();
  o.seed = vm["seed"].as<std::uint64_t>();
  stopwatch clock;
  const std::string out = vm["out"].as<std::string>();
  auto shards = data::write_synthetic_shards(out, o, [&](std::int64_t done, std::int64_t total) {
    fmt::print("prep: {} / {} instances ({:.1f} s)\n", done, total, clock.seconds());
    std::fflush(stdout);
  });
  if (!shards) {
    fmt::print(stderr, "dsactor prep synthetic: {}\n", shards.err().message);
    return shards.err().code == errc::invalid_argument ? 2 : 1;
  }
  fmt::print("prep: done: {} train shard(s) and vocab.txt in {} ({:.1f} s)\n", *shards, out, clock.seconds());
  return 0;
}

} // namespace

int cmd_prep(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    fmt::print(
        "usage: dsactor prep WHAT [options]\n"
        "  pretrain         corpus -> BERT pre-training shards ('dsactor prep pretrain --help')\n"
        "  synthetic        random instances -> pre-training shards, any size ('dsactor prep synthetic --help')\n"
        "  qa-from-corpus   corpus -> extractive QA set in SQuAD v1.1 format\n");
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "pretrain"))
    return prep_pretrain(argc - 1, argv + 1);
  if (!std::strcmp(argv[1], "synthetic"))
    return prep_synthetic(argc - 1, argv + 1);
  if (!std::strcmp(argv[1], "qa-from-corpus"))
    return prep_qa_from_corpus(argc - 1, argv + 1);
  fmt::print(stderr,
             "dsactor prep: unknown action '{}' (expected 'pretrain', 'synthetic' or 'qa-from-corpus')\n",
             argv[1]);
  return 2;
}

} // namespace dsa::tools
