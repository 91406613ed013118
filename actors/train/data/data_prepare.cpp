// Vocabulary and pre-training shards from a corpus, when absent.
#include "actors/train/data/data_prepare.hpp"

#include "core/log.hpp"
#include "io/ckpt/atomic_file.hpp"
#include "io/data/corpus.hpp"
#include "io/data/pretrain_builder.hpp"
#include "io/data/pretrain_shard.hpp"
#include "io/data/squad_qa_gen.hpp"
#include "models/tokenizer/vocab_builder.hpp"

#include <algorithm>
#include <filesystem>

namespace dsa::train {
namespace fs = std::filesystem;
namespace {

std::size_t block_bytes(const prepare_settings& p) { return static_cast<std::size_t>(p.block_mb * 1024 * 1024); }

// Word counts add up block by block, so the vocabulary is the whole corpus's with one block
// of text in memory (the counts grow with the distinct words, not the corpus).
status build_vocab(const prepare_settings& p, const std::string& path) {
  tok::word_counter counter(tok::tokenizer_options{});
  int blocks = 0;
  DSA_TRY(data::for_each_document_block(p.corpus, block_bytes(p), [&](std::vector<data::document>&& docs) -> status {
    for (const auto& d : docs)
      for (const auto& para : d.paragraphs)
        for (const auto& s : para.sentences) counter.add_text(s);
    ++blocks;
    return {};
  }));
  tok::vocab_build_options options;
  options.size = static_cast<int>(p.vocab_size);
  options.progress = [](std::int64_t merges, std::int64_t size) {
    log_info("prepare: vocabulary: {} merges, {} tokens", merges, size);
  };
  auto tokens = tok::build_wordpiece_vocab(counter.counts(), options);
  std::string text;
  for (const auto& t : tokens) text += t + "\n";
  DSA_TRY(ckpt::write_file_atomic(path, text));
  log_info("prepare: wrote {} ({} tokens from {} distinct words, {} block(s) of the corpus)", path, tokens.size(),
           counter.counts().size(), blocks);
  return {};
}

// Writes `all` as shards <prefix>-<index>..., advancing index.
status write_set(const std::string& dir, const char* prefix, const std::vector<data::pretrain_instance>& all,
                 const prepare_settings& p, const data::shard_layout& layout, int& index) {
  const auto per = static_cast<std::size_t>(p.instances_per_shard);
  ckpt::metadata_map meta{{"seed", std::to_string(p.seed)}, {"dupe_factor", std::to_string(p.dupe_factor)}};
  const int first = index;
  for (std::size_t begin = 0; begin < all.size(); begin += per, ++index) {
    std::size_t end = std::min(all.size(), begin + per);
    std::string path = data::shard_file_name((fs::path(dir) / prefix).string(), index);
    DSA_TRY(data::write_pretrain_shard(path, all, begin, end, layout, meta));
  }
  log_info("prepare: {} {} instances in {} shard(s)", all.size(), prefix, index - first);
  return {};
}

} // namespace

expected<std::vector<std::string>> list_shards(const std::string& spec) {
  std::error_code ec;
  fs::path dir = spec, prefix;
  if (!fs::is_directory(spec, ec)) {
    dir = fs::path(spec).parent_path();
    prefix = fs::path(spec).filename();
  }
  if (dir.empty()) dir = ".";
  std::vector<std::string> out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (it->path().extension() != ".safetensors") continue;
    if (!prefix.empty() && name.rfind(prefix.string() + "-", 0) != 0) continue;
    out.push_back(it->path().string());
  }
  if (ec) return make_error(errc::io, "{}: cannot list shards: {}", dir.string(), ec.message());
  if (out.empty()) return make_error(errc::not_found, "{}: no shards (*.safetensors) found", spec);
  std::sort(out.begin(), out.end());
  return out;
}

status prepare_pretraining_data(const prepare_settings& p, const std::string& vocab_path) {
  std::error_code ec;
  // The shards are written a block at a time, so a preparation that stops half-way leaves
  // some: this marker, there until the last shard is written, says they are not a set.
  const std::string marker = (fs::path(p.out_dir) / ".preparing").string();
  const bool interrupted = fs::exists(marker, ec);
  bool have_vocab = fs::exists(vocab_path, ec);
  bool have_train = !interrupted && list_shards(p.out_dir + "/train").has_value();
  if (have_vocab && have_train) return {};
  fs::create_directories(p.out_dir, ec);
  if (ec) return make_error(errc::io, "data.prepare.out_dir '{}': cannot create: {}", p.out_dir, ec.message());
  if (interrupted) log_warn("prepare: {} was left by a preparation that did not finish: its shards are made again", marker);
  DSA_TRY(ckpt::write_file_atomic(marker, "a dsactor [data.prepare] is writing the shards here\n"));
  // Shards of an earlier preparation go first: this one may write fewer.
  for (fs::directory_iterator it(p.out_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (it->path().extension() == ".safetensors" && (name.rfind("train-", 0) == 0 || name.rfind("holdout-", 0) == 0))
      fs::remove(it->path(), ec);
  }
  if (ec) return make_error(errc::io, "data.prepare.out_dir '{}': cannot clear its old shards: {}", p.out_dir, ec.message());
  if (!have_vocab) {
    log_info("prepare: counting the words of {}", p.corpus);
    DSA_TRY(build_vocab(p, vocab_path));
  }
  DSA_ASSIGN_OR_RETURN(auto v, tok::vocab::load(vocab_path));
  const data::masking_vocab masking = data::masking_vocab::from(v);
  tok::bert_tokenizer tokenizer(std::move(v), tok::tokenizer_options{});
  data::pretrain_options options;
  options.max_seq_length = static_cast<int>(p.seq_length);
  options.dupe_factor = static_cast<int>(p.dupe_factor);
  options.short_seq_prob = p.short_seq_prob;
  options.masking.masked_lm_prob = p.masked_lm_prob;
  options.masking.max_predictions = static_cast<int>(p.max_predictions);
  options.seed = p.seed;
  const data::shard_layout layout{static_cast<int>(p.seq_length), static_cast<int>(p.max_predictions),
                                  tokenizer.vocabulary().size(), data::shard_vocab_of(tokenizer.vocabulary())};
  // The corpus a block at a time, as `dsactor prep pretrain` reads it: a block's documents,
  // tokens and instances are in memory only until its shards are written. The held-out
  // documents come from the first block, which uses the seed itself, so a corpus of one
  // block gives the shards it always gave; later blocks derive theirs.
  log_info("prepare: reading the corpus {} ({} MB at a time)", p.corpus, p.block_mb);
  std::vector<data::tokenized_document> holdout_docs;
  int blocks = 0, train_shards = 0;
  DSA_TRY(data::for_each_document_block(p.corpus, block_bytes(p), [&](std::vector<data::document>&& docs) -> status {
    auto tokenized = data::tokenize_documents(docs, tokenizer);
    docs.clear();
    docs.shrink_to_fit();
    if (blocks == 0) {
      if (p.holdout_docs >= static_cast<std::int64_t>(tokenized.size()))
        return make_error(errc::config,
                          "data.prepare.holdout_docs = {} leaves no training documents of {} (the held-out documents "
                          "come from the first data.prepare.block_mb of the corpus)",
                          p.holdout_docs, tokenized.size());
      auto [train_docs, held] = data::split_holdout(std::move(tokenized), p.holdout_docs, p.seed);
      tokenized = std::move(train_docs);
      holdout_docs = std::move(held);
    }
    data::pretrain_options block = options;
    if (blocks > 0) block.seed = data::derive_seed(p.seed, 0x626c6f636bull, static_cast<std::uint64_t>(blocks));
    const std::int64_t every = std::max<std::int64_t>(1, static_cast<std::int64_t>(tokenized.size()) / 4);
    block.progress = [every, blocks](std::int64_t done, std::int64_t total) {
      if (done % every == 0 || done == total)
        log_info("prepare: block {}: instances: {} / {} document passes", blocks, done, total);
    };
    auto train = data::create_pretraining_instances(std::move(tokenized), masking, block);
    DSA_TRY(write_set(p.out_dir, "train", train, p, layout, train_shards));
    ++blocks;
    return {};
  }));
  if (!holdout_docs.empty()) {
    data::pretrain_options held = options;
    held.dupe_factor = 1;
    held.seed = data::derive_seed(p.seed, 0x686f6c646f7574ull);
    held.progress = nullptr;
    auto instances = data::create_pretraining_instances(std::move(holdout_docs), masking, held);
    int holdout_shards = 0;
    DSA_TRY(write_set(p.out_dir, "holdout", instances, p, layout, holdout_shards));
  }
  fs::remove(marker, ec);
  if (ec) return make_error(errc::io, "data.prepare: cannot remove {}: {}", marker, ec.message());
  return {};
}

status prepare_qa_data(const prepare_qa_settings& p) {
  std::error_code ec;
  if (fs::exists(p.out_dir + "/train.json", ec) && fs::exists(p.out_dir + "/dev.json", ec)) return {};
  fs::create_directories(p.out_dir, ec);
  if (ec) return make_error(errc::io, "data.prepare_qa.out_dir '{}': cannot create: {}", p.out_dir, ec.message());
  DSA_ASSIGN_OR_RETURN(auto docs, data::read_corpus(p.corpus));
  data::qa_gen_options o;
  o.seed = p.seed;
  o.dev_fraction = p.dev_fraction;
  o.max_questions = p.max_questions;
  DSA_ASSIGN_OR_RETURN(auto qa, data::generate_qa_from_corpus(docs, o));
  DSA_TRY(data::write_squad(p.out_dir + "/dev.json", qa.dev));
  DSA_TRY(data::write_squad(p.out_dir + "/train.json", qa.train));
  log_info("prepare: generated a QA set from {} into {}", p.corpus, p.out_dir);
  return {};
}

} // namespace dsa::train
