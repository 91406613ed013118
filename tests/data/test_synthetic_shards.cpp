// Tests for io/data/synthetic_shards: random instances in the shard format, one shard at a
// time, loadable and checked by the reader like any prepared shard.
#include "io/data/pretrain_shard.hpp"
#include "io/data/synthetic_shards.hpp"
#include "models/tokenizer/bert_tokenizer.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>

using namespace dsa;

namespace {

std::string fresh_dir(const char* name) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("dsa-synthetic-{}-{}", name, ::getpid());
  std::filesystem::remove_all(dir);
  return dir.string();
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

} // namespace

TEST_CASE("synthetic shards: the counts, the layout and the vocabulary, rows the reader accepts") {
  const std::string dir = fresh_dir("a");
  data::synthetic_shard_options o;
  o.instances = 25;
  o.per_shard = 10;
  o.seq_length = 32;
  o.max_predictions = 5;
  o.vocab_size = 50;
  std::vector<std::int64_t> progress;
  auto shards = data::write_synthetic_shards(dir, o, [&](std::int64_t done, std::int64_t) { progress.push_back(done); });
  REQUIRE_MESSAGE(shards.has_value(), (shards ? "" : shards.err().message));
  CHECK(*shards == 3);
  CHECK(progress == std::vector<std::int64_t>{10, 20, 25});
  auto v = tok::vocab::load(dir + "/vocab.txt");
  REQUIRE(v.has_value());
  CHECK(v->size() == 50);
  std::int64_t rows = 0;
  for (int s = 0; s < 3; ++s) {
    auto shard = data::pretrain_shard::load(data::shard_file_name(dir + "/train", s)); // checks every row
    REQUIRE_MESSAGE(shard.has_value(), (shard ? "" : shard.err().message));
    CHECK(shard->layout().seq_length == 32);
    CHECK(shard->layout().max_predictions == 5);
    CHECK(shard->layout().vocab == data::shard_vocab_of(*v));
    for (std::int64_t i = 0; i < shard->count(); ++i) {
      const auto x = shard->row(i);
      CHECK(x.input_ids.front() == v->cls_id());
      CHECK(x.input_ids.back() == v->sep_id());
      CHECK(!x.masked_lm_positions.empty());
      CHECK(x.masked_lm_positions.size() <= 5);
    }
    rows += shard->count();
  }
  CHECK(rows == 25);
  // Same seed, same files.
  const std::string again = fresh_dir("b");
  REQUIRE(data::write_synthetic_shards(again, o).has_value());
  CHECK(file_text(dir + "/train-00001.safetensors") == file_text(again + "/train-00001.safetensors"));
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(again);
}

TEST_CASE("synthetic shards: bad sizes are refused by name") {
  data::synthetic_shard_options o;
  o.instances = 0;
  auto none = data::write_synthetic_shards(fresh_dir("c"), o);
  REQUIRE_FALSE(none.has_value());
  CHECK(none.err().message.find("instances") != std::string::npos);
  o.instances = 5;
  o.max_predictions = 200;
  auto wide = data::write_synthetic_shards(fresh_dir("c"), o);
  REQUIRE_FALSE(wide.has_value());
  CHECK(wide.err().message.find("max predictions 200") != std::string::npos);
}
