// Pre-training shards: write/read round trip, padding, validation; the shard
// reader's shuffle buffer, epochs and cursor resume (resumed == uninterrupted).
#include "io/data/pretrain_shard.hpp"
#include "io/data/shard_reader.hpp"
#include "tests/data/corpus_test_util.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

using namespace dsa::data;

namespace {

// Instance `tag`: [CLS] tag ... [SEP] x [SEP] with one or two targets; input_ids[1] = tag
// identifies it.
pretrain_instance tagged_instance(std::int32_t tag) {
  pretrain_instance inst;
  std::int32_t len = 5 + tag % 7;
  inst.input_ids = {2, 100 + tag};
  for (std::int32_t k = 0; k < len; ++k)
    inst.input_ids.push_back(6 + (tag + k) % 50);
  inst.input_ids.push_back(3);
  inst.token_type_ids.assign(inst.input_ids.size(), 0);
  inst.input_ids.push_back(7);
  inst.input_ids.push_back(3);
  inst.token_type_ids.resize(inst.input_ids.size(), 1);
  inst.masked_lm_positions = {2};
  inst.masked_lm_ids = {inst.input_ids[2]};
  inst.input_ids[2] = 4;
  if (tag % 2) {
    inst.masked_lm_positions.push_back(3);
    inst.masked_lm_ids.push_back(inst.input_ids[3]);
    inst.input_ids[3] = 4;
  }
  inst.next_sentence_label = tag % 2;
  return inst;
}

bool same(const pretrain_instance& a, const pretrain_instance& b) {
  return a.input_ids == b.input_ids && a.token_type_ids == b.token_type_ids &&
         a.masked_lm_positions == b.masked_lm_positions && a.masked_lm_ids == b.masked_lm_ids &&
         a.next_sentence_label == b.next_sentence_label;
}

const shard_layout layout{32, 5, 400, {}};

// Shards of 7, 13, 1 and 10 instances tagged 0..30.
std::vector<std::string> write_shards(const dsa::test::scratch_dir& dir) {
  std::vector<pretrain_instance> all;
  for (std::int32_t t = 0; t < 31; ++t)
    all.push_back(tagged_instance(t));
  std::vector<std::string> paths;
  std::size_t begin = 0;
  for (std::size_t size : {7, 13, 1, 10}) {
    paths.push_back(shard_file_name(dir.file("train"), static_cast<std::int64_t>(paths.size())));
    REQUIRE(write_pretrain_shard(paths.back(), all, begin, begin + size, layout, {{"seed", "1"}})
                .has_value());
    begin += size;
  }
  return paths;
}

std::vector<pretrain_instance> read_n(shard_reader& r, int n) {
  std::vector<pretrain_instance> out;
  pretrain_instance inst;
  for (int i = 0; i < n; ++i) {
    auto more = r.next(inst);
    REQUIRE(more.has_value());
    if (!*more)
      break;
    out.push_back(inst);
  }
  return out;
}

dsa::tok::vocab small_vocab() {
  std::vector<std::string> t{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]"};
  for (int i = 6; i < 400; ++i)
    t.push_back("w" + std::to_string(i));
  return dsa::tok::vocab::from_tokens(t);
}

} // namespace

TEST_CASE("shards: round trip, padding and metadata") {
  dsa::test::scratch_dir dir("shards");
  auto paths = write_shards(dir);
  CHECK(paths[2].size() > 20);
  CHECK(paths[1].substr(paths[1].size() - 23) == "train-00001.safetensors");
  auto shard = pretrain_shard::load(paths[1]);
  REQUIRE(shard.has_value());
  CHECK(shard->count() == 13);
  CHECK(shard->layout().seq_length == 32);
  CHECK(shard->layout().max_predictions == 5);
  CHECK(shard->metadata().at("seed") == "1");
  CHECK(shard->metadata().at("format") == "dsactor-pretrain-v1");
  for (std::int64_t i = 0; i < 13; ++i)
    CHECK(same(shard->row(i), tagged_instance(static_cast<std::int32_t>(7 + i))));

  std::vector<pretrain_instance> two{tagged_instance(1), tagged_instance(2)};
  auto t = pack_instances(two, 0, 2, layout);
  CHECK(t.at("input_ids").shape() == dsa::shape_t{2, 32});
  CHECK(t.at("masked_lm_ids").shape() == dsa::shape_t{2, 5});
  CHECK(t.at("next_sentence_labels").shape() == dsa::shape_t{2});
  const auto* ids = t.at("masked_lm_ids").data<std::int32_t>();
  const auto* pos = t.at("masked_lm_positions").data<std::int32_t>();
  const auto* mask = t.at("attention_mask").data<std::int32_t>();
  CHECK(ids[2] == -1);     // row 0 has two targets, then -1 padding
  CHECK(pos[2] == 0);      // positions pad with 0
  CHECK(ids[5 + 1] == -1); // row 1 has one target
  CHECK(mask[two[0].input_ids.size() - 1] == 1);
  CHECK(mask[two[0].input_ids.size()] == 0);
}

TEST_CASE("shards: the vocabulary's special ids and fingerprint travel in the metadata") {
  dsa::test::scratch_dir dir("shardvocab");
  const dsa::tok::vocab v = small_vocab();
  shard_layout with_vocab = layout;
  with_vocab.vocab = shard_vocab_of(v);
  CHECK(with_vocab.vocab.cls_id == 2);
  CHECK(with_vocab.vocab.sep_id == 3);
  CHECK(with_vocab.vocab.mask_id == 4);
  CHECK(with_vocab.vocab.pad_id == 0);
  CHECK(with_vocab.vocab.fingerprint.size() == 16);
  std::vector<pretrain_instance> rows{tagged_instance(1), tagged_instance(2)};
  const std::string path = dir.file("train-00000.safetensors");
  REQUIRE(write_pretrain_shard(path, rows, 0, 2, with_vocab).has_value());
  auto shard = pretrain_shard::load(path);
  REQUIRE(shard.has_value());
  CHECK(shard->layout().vocab_size == 400);
  CHECK(shard->layout().vocab == with_vocab.vocab);
  CHECK(shard->metadata().at("mask_id") == "4");
  auto reader = shard_reader::open({path}, {});
  REQUIRE(reader.has_value());
  CHECK(reader->layout().vocab == with_vocab.vocab);
  CHECK(check_shard_vocab(shard->layout(), path, v, "vocab.txt").has_value());

  // Another vocabulary: an error naming both files and what differs.
  auto mismatch = [&](const dsa::tok::vocab& other, const char* what) {
    auto st = check_shard_vocab(shard->layout(), path, other, "other/vocab.txt");
    REQUIRE_FALSE(st.has_value());
    CHECK(st.err().code == dsa::errc::config);
    const std::string& m = st.err().message;
    CHECK_MESSAGE(m.find("other/vocab.txt") != std::string::npos, m);
    CHECK_MESSAGE(m.find(path) != std::string::npos, m);
    CHECK_MESSAGE(m.find(what) != std::string::npos, m);
  };
  std::vector<std::string> tokens = v.tokens();
  tokens.pop_back();
  mismatch(dsa::tok::vocab::from_tokens(tokens), "399 tokens");
  tokens = v.tokens();
  std::swap(tokens[2], tokens[3]); // [SEP] before [CLS]
  mismatch(dsa::tok::vocab::from_tokens(tokens), "cls_id is 3");
  tokens = v.tokens();
  tokens[200] = "changed";
  mismatch(dsa::tok::vocab::from_tokens(tokens), "the tokens differ");

  // A shard written without the vocabulary facts (older shards) is checked by size only.
  const std::string old_path = dir.file("old-00000.safetensors");
  REQUIRE(write_pretrain_shard(old_path, rows, 0, 2, layout).has_value());
  auto old = pretrain_shard::load(old_path);
  REQUIRE(old.has_value());
  CHECK(old->layout().vocab == shard_vocab_info{});
  CHECK(old->metadata().count("vocab_fingerprint") == 0);
  CHECK(check_shard_vocab(old->layout(), old_path, dsa::tok::vocab::from_tokens(tokens), "v.txt")
            .has_value());
  // Shards of one data set must come from one vocabulary.
  auto mixed = shard_reader::open({path, old_path}, {});
  REQUIRE_FALSE(mixed.has_value());
  CHECK(mixed.err().message.find("different vocabularies") != std::string::npos);
}

TEST_CASE("shards: a file that is not a shard is refused by name") {
  dsa::test::scratch_dir dir("notshard");
  std::string path = dir.file("x.safetensors");
  dsa::ckpt::named_tensors tensors{{"input_ids", dsa::tensor::zeros({1, 4}, dsa::dtype::i32)}};
  REQUIRE(dsa::ckpt::write_safetensors(path, tensors, {}).has_value());
  auto shard = pretrain_shard::load(path);
  REQUIRE_FALSE(shard.has_value());
  CHECK(shard.err().message.find(path) != std::string::npos);
  CHECK_FALSE(shard_reader::open({path}, {}).has_value());
}

TEST_CASE("shard reader: every epoch is a permutation, the order depends on the seed") {
  dsa::test::scratch_dir dir("reader");
  auto paths = write_shards(dir);
  shard_reader_options o;
  o.shuffle_buffer = 5;
  o.seed = 11;
  auto r = shard_reader::open(paths, o);
  REQUIRE(r.has_value());
  CHECK(r->instances_per_epoch() == 31);
  std::vector<std::int32_t> order;
  for (int epoch = 0; epoch < 3; ++epoch) {
    auto got = read_n(*r, 31);
    REQUIRE(got.size() == 31);
    std::vector<std::int32_t> tags;
    for (auto& g : got)
      tags.push_back(g.input_ids[1] - 100);
    for (auto& g : got)
      CHECK(same(g, tagged_instance(g.input_ids[1] - 100)));
    if (epoch == 0)
      order = tags;
    else
      CHECK(tags != order); // a new permutation each epoch
    std::sort(tags.begin(), tags.end());
    for (std::int32_t t = 0; t < 31; ++t)
      CHECK(tags[static_cast<std::size_t>(t)] == t);
  }
  CHECK(r->cursor().epoch == 2);

  shard_reader_options plain;
  plain.shuffle_buffer = 1;
  plain.order = shard_order::in_order;
  plain.epochs = 1;
  auto p = shard_reader::open(paths, plain);
  REQUIRE(p.has_value());
  auto got = read_n(*p, 100);
  REQUIRE(got.size() == 31); // one epoch, then the end
  for (std::int32_t t = 0; t < 31; ++t)
    CHECK(got[static_cast<std::size_t>(t)].input_ids[1] == 100 + t);
}

TEST_CASE("shard reader: a resumed stream equals the uninterrupted one") {
  dsa::test::scratch_dir dir("resume");
  auto paths = write_shards(dir);
  for (auto masking : {masking_source::stored, masking_source::dynamic}) {
    shard_reader_options o;
    o.shuffle_buffer = 6;
    o.seed = 77;
    o.masking = masking;
    o.vocab = masking_vocab::from(small_vocab());
    auto whole = shard_reader::open(paths, o);
    REQUIRE(whole.has_value());
    auto reference = read_n(*whole, 80);
    REQUIRE(reference.size() == 80);
    for (int k : {0, 1, 4, 30, 31, 32, 45, 79}) {
      auto first = shard_reader::open(paths, o);
      REQUIRE(first.has_value());
      read_n(*first, k);
      auto saved = shard_cursor::from_array(first->cursor().to_array());
      auto second = shard_reader::open(paths, o);
      REQUIRE(second.has_value());
      REQUIRE(second->seek(saved).has_value());
      CHECK(second->cursor() == saved);
      auto rest = read_n(*second, 80 - k);
      REQUIRE(rest.size() == static_cast<std::size_t>(80 - k));
      bool equal = true;
      for (std::size_t i = 0; i < rest.size(); ++i)
        equal = equal && same(rest[i], reference[k + i]);
      CHECK_MESSAGE(equal, "resume after " << k);
    }
    auto third = shard_reader::open(paths, o);
    REQUIRE(third.has_value());
    shard_cursor bogus{0, 3, 0, 0, 12345};
    CHECK_FALSE(third->seek(bogus).has_value());
  }
}

TEST_CASE("shard reader: skipping n instances continues as reading them, across epochs") {
  dsa::test::scratch_dir dir("skip");
  auto paths = write_shards(dir);
  for (auto masking : {masking_source::stored, masking_source::dynamic}) {
    shard_reader_options o;
    o.shuffle_buffer = 6;
    o.seed = 91;
    o.masking = masking;
    o.vocab = masking_vocab::from(small_vocab());
    auto whole = shard_reader::open(paths, o);
    REQUIRE(whole.has_value());
    auto reference = read_n(*whole, 90);
    for (int k : {0, 1, 7, 30, 31, 62}) {
      auto r = shard_reader::open(paths, o);
      REQUIRE(r.has_value());
      CHECK(r->skip(k) == k);
      auto rest = read_n(*r, 90 - k);
      REQUIRE(rest.size() == static_cast<std::size_t>(90 - k));
      bool equal = true;
      for (std::size_t i = 0; i < rest.size(); ++i) equal = equal && same(rest[i], reference[k + i]);
      CHECK_MESSAGE(equal, "skip " << k);
      CHECK(r->cursor() == whole->cursor());
    }
  }
}

TEST_CASE("shard reader: dynamic masking re-draws targets per epoch and keeps the tokens") {
  dsa::test::scratch_dir dir("dynamic");
  auto paths = write_shards(dir);
  shard_reader_options o;
  o.shuffle_buffer = 1;
  o.order = shard_order::in_order;
  o.masking = masking_source::dynamic;
  o.vocab = masking_vocab::from(small_vocab());
  o.dynamic_masking.max_predictions = 5;
  auto r = shard_reader::open(paths, o);
  REQUIRE(r.has_value());
  auto e0 = read_n(*r, 31), e1 = read_n(*r, 31);
  int differ = 0;
  for (std::size_t i = 0; i < 31; ++i) {
    auto a = e0[i], b = e1[i], original = tagged_instance(static_cast<std::int32_t>(i));
    unmask_instance(a);
    unmask_instance(b);
    unmask_instance(original);
    CHECK(a.input_ids == original.input_ids);
    CHECK(b.input_ids == original.input_ids);
    differ += e0[i].masked_lm_positions != e1[i].masked_lm_positions;
    CHECK(!e0[i].masked_lm_positions.empty());
  }
  CHECK(differ > 10);
  auto batch = r->next_batch(4);
  REQUIRE(batch.has_value());
  CHECK(batch->at("input_ids").shape() == dsa::shape_t{4, 32});
}

namespace {
// A field of /proc/self/status in bytes (RssAnon: anonymous resident memory; VmRSS: all of it,
// mapped file pages included).
std::int64_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string key;
  std::int64_t kb = 0;
  while (in >> key) {
    if (key == field + ":") {
      in >> kb;
      return kb * 1024;
    }
    in.ignore(1 << 16, '\n');
  }
  return -1;
}
std::int64_t rss_anon() { return status_bytes("RssAnon"); }
} // namespace

// A shard is mapped, not read: its rows live in the page cache (file-backed pages the kernel
// may drop), so a reader that keeps a whole shard open while its rows stream out does not
// hold it in anonymous memory (issue: the data set resident for most of an epoch).
TEST_CASE("shards are mapped and given back: reading a 26 MB shard adds no resident memory of its size") {
  dsa::test::scratch_dir dir("mapped");
  const shard_layout wide{256, 20, 400, {}};
  const std::string path = shard_file_name(dir.file("big"), 0);
  {
    std::vector<pretrain_instance> rows;
    for (std::int32_t t = 0; t < 8000; ++t) rows.push_back(tagged_instance(t % 40));
    REQUIRE(write_pretrain_shard(path, rows, 0, rows.size(), wide, {{"seed", "1"}}).has_value());
  }
  const auto file_bytes = static_cast<std::int64_t>(std::filesystem::file_size(path));
  REQUIRE(file_bytes > 25'000'000);
  const std::int64_t before = rss_anon(), resident_before = status_bytes("RssFile");
  REQUIRE(before > 0);
  shard_reader_options o;
  o.shuffle_buffer = 64;
  o.seed = 3;
  auto reader = shard_reader::open({path}, o);
  REQUIRE(reader.has_value());
  const auto got = read_n(*reader, 4000); // the shard stays open: half its rows are still due
  REQUIRE(got.size() == 4000);
  for (const auto& inst : got) CHECK(inst.input_ids[1] >= 100);
  const std::int64_t grown = rss_anon() - before;
  CAPTURE(grown);
  CAPTURE(file_bytes);
  CHECK(grown < file_bytes / 4);
  // Nor resident file pages of its size: each row read gives its pages back (they stay in
  // the page cache), and the load's check every 1,024 rows: within the reader's bound.
  const std::int64_t resident = status_bytes("RssFile") - resident_before;
  CAPTURE(resident);
  CHECK(resident <= shard_reader::resident_bound(256, 20));
  CHECK(shard_reader::resident_bound(256, 20) < file_bytes / 4);
  // The same values as a read: the mapped tensors are the file's bytes.
  auto mapped = dsa::ckpt::map_safetensors(path);
  auto read = dsa::ckpt::read_safetensors(path);
  REQUIRE(mapped.has_value());
  REQUIRE(read.has_value());
  for (const auto& [name, t] : read->tensors) {
    CAPTURE(name);
    const auto& m = mapped->tensors.at(name);
    REQUIRE(m.nbytes() == t.nbytes());
    CHECK(std::memcmp(m.raw_data(), t.raw_data(), t.nbytes()) == 0);
    CHECK(m.storage_ptr() == mapped->tensors.begin()->second.storage_ptr()); // one mapping
  }
}
