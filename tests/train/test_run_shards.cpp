// Pre-training from shards that `prep pretrain` (here [data.prepare]) wrote: the
// vocabulary size comes from their metadata, data.vocab is optional, and a
// vocabulary (or held-out set) that is not the shards' own is refused naming both files.
#include "tests/train/train_fixture.hpp"

#include "io/data/pretrain_shard.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <tuple>
#include <unistd.h>

using namespace dsa;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The tiny config without its [data.prepare] table, so that nothing names a vocabulary.
std::string without_prepare(std::string config) {
  const auto begin = config.find("[data.prepare]");
  REQUIRE(begin != std::string::npos);
  const auto end = config.find("\n\n", begin);
  REQUIRE(end != std::string::npos);
  return config.erase(begin, end + 2 - begin);
}

// A run from the shards under dir/data, starting from the weights in dir/ckpt; `extra`
// comes last, so it overrides these.
std::vector<std::string> shards_overrides(const std::string& dir,
                                          const std::vector<std::string>& extra = {}) {
  std::vector<std::string> out;
  for (std::string o :
       {"train_steps=2", "run_dir=\"{0}/shards_run\"", "init_checkpoint=\"{0}/ckpt\"",
        "checkpoint.dir=\"{0}/shards_ckpt\"", "data.train_shards=\"{0}/data/train\"",
        "data.eval_shards=\"{0}/data/holdout\""})
    out.push_back(fmt::format(o, dir));
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

// Runs with stderr sent to a file; returns the exit code and what was printed.
std::pair<int, std::string> run_capturing(const std::string& dir, const std::string& config,
                                          const std::vector<std::string>& overrides) {
  const std::string err_path = dir + "/stderr.txt";
  std::fflush(stderr);
  const int saved = dup(2);
  REQUIRE(saved >= 0);
  std::FILE* f = std::fopen(err_path.c_str(), "w");
  REQUIRE(f != nullptr);
  dup2(fileno(f), 2);
  const int rc = test::run_config(dir, "shards", config, overrides);
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::fclose(f);
  return {rc, read_text(err_path)};
}

} // namespace

TEST_CASE("pre-training from shards needs no data.vocab; another vocabulary is refused naming both "
          "files") {
  test::temp_dir dir;
  const std::string& d = dir.path();
  REQUIRE(test::run_config(d, "prep", test::tiny_config(d), {"train_steps=2"}) == 0);
  const std::string vocab_path = d + "/data/vocab.txt";
  const std::string vocab_text = read_text(vocab_path);
  const auto vocab_size = std::count(vocab_text.begin(), vocab_text.end(), '\n');
  REQUIRE(vocab_size > 100);
  const std::string config = without_prepare(test::tiny_config(d));
  REQUIRE(config.find("vocab") == std::string::npos);

  // No data.vocab: the model's vocabulary size is the shards' (the initial weights, made with
  // that size, load), and the run trains.
  int rc = 0;
  std::string err;
  std::tie(rc, err) = run_capturing(d, config, shards_overrides(d));
  CHECK_MESSAGE(rc == 0, err);
  CHECK(read_text(d + "/shards_run/train.log").find(fmt::format("vocab {} ", vocab_size)) !=
        std::string::npos);

  // The shards' own vocabulary agrees.
  std::tie(rc, err) =
      run_capturing(d, config, shards_overrides(d, {fmt::format("data.vocab=\"{}\"", vocab_path)}));
  CHECK_MESSAGE(rc == 0, err);

  // The same tokens in another order: same size, other ids.
  std::vector<std::string> lines;
  std::istringstream in(vocab_text);
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  std::swap(lines[lines.size() - 1], lines[lines.size() - 2]);
  const std::string other = d + "/other-vocab.txt";
  {
    std::ofstream out(other);
    for (const auto& line : lines)
      out << line << '\n';
  }
  std::tie(rc, err) =
      run_capturing(d, config, shards_overrides(d, {fmt::format("data.vocab=\"{}\"", other)}));
  CHECK(rc == 2); // the config names two files that disagree: a configuration error
  // The run's last words, after the logged configuration (which names the vocabulary too).
  const auto at = err.rfind("dsactor run: ");
  REQUIRE_MESSAGE(at != std::string::npos, err);
  const std::string message = err.substr(at);
  CHECK_MESSAGE(message.find(other) != std::string::npos, message);
  CHECK_MESSAGE(message.find(d + "/data/train-00000.safetensors") != std::string::npos, message);

  // Held-out shards from another vocabulary are refused before training, naming both sets.
  data::pretrain_instance row;
  row.input_ids = {2, 4, 3, 9, 3};
  row.token_type_ids = {0, 0, 0, 1, 1};
  row.masked_lm_positions = {1};
  row.masked_lm_ids = {7};
  const std::string foreign = d + "/foreign-00000.safetensors";
  REQUIRE(data::write_pretrain_shard(foreign, {row}, 0, 1, data::shard_layout{32, 5, 50, {}})
              .has_value());
  std::tie(rc, err) = run_capturing(
      d, config, shards_overrides(d, {fmt::format("data.eval_shards=\"{}/foreign\"", d)}));
  CHECK(rc == 2);
  const std::string eval_message = err.substr(std::min(err.size(), err.rfind("dsactor run: ")));
  CHECK_MESSAGE(eval_message.find(foreign) != std::string::npos, err);
  CHECK_MESSAGE(eval_message.find(d + "/data/train-00000.safetensors") != std::string::npos, err);

  // Dynamic masking draws tokens from the vocabulary: there data.vocab is required.
  std::tie(rc, err) = run_capturing(d, config, shards_overrides(d, {"data.dynamic_masking=true"}));
  CHECK(rc == 2);
  CHECK_MESSAGE(err.find("data.vocab") != std::string::npos, err);
}
