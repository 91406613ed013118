// Tests for train::open_stage_sources: a ZeRO resume reads, from a real checkpoint's
// per-rank (or whole ZeRO-0) optimizer files and its model file, only the byte ranges of
// its new partition, gets bit for bit what assembling whole tensors gives, and reports
// short or missing files naming the file and tensor.
#include "actors/train/shard/partition_resume.hpp"

#include "core/memory_stats.hpp"
#include "io/ckpt/checkpoint_dir.hpp"
#include "tests/io/io_test_util.hpp"
#include "tests/optim/zero_ranks.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <string>

namespace {

using namespace dsa;
using namespace dsa::test::zero;
using optim::saved_partitions;
using optim::state_map;

namespace fs = std::filesystem;

// A stage's whole state (masters, moments, step 5) under whole_shard::payload's names.
state_map whole_state(const std::vector<flat_tensor_spec>& specs) {
  state_map m;
  std::uint32_t seed = 7;
  for (const auto& s : specs) {
    m["master." + s.name] = uniform_tensor(s.shape, -1.0f, 1.0f, seed++);
    m[s.name + ".exp_avg"] = uniform_tensor(s.shape, -0.1f, 0.1f, seed++);
    m[s.name + ".exp_avg_sq"] = uniform_tensor(s.shape, 0.0f, 0.01f, seed++);
  }
  tensor count = tensor::empty({1}, dtype::i64);
  count.data<std::int64_t>()[0] = 5;
  m["optimizer_step_count"] = count;
  return m;
}

saved_partitions must_index(std::vector<optim::saved_partition> parts) {
  auto s = saved_partitions::index(std::move(parts));
  REQUIRE_MESSAGE(s.has_value(), s.err().to_string());
  return std::move(*s);
}

// A checkpoint as a ZeRO run over `old_ranks` writes it (old_ranks 0: a ZeRO-0 run's
// whole optimizer group): the masters whole in the model file, the moments per rank.
std::string save(const std::string& root, const std::vector<flat_tensor_spec>& specs, const state_map& whole,
                 std::uint32_t old_ranks) {
  ckpt::checkpoint_contents c;
  c.step = 5;
  for (const auto& s : specs) c.groups["model"][s.name] = whole.at("master." + s.name);
  if (old_ranks == 0) {
    for (const auto& [key, t] : whole)
      if (key.rfind("master.", 0) != 0) c.groups["optimizer_0"][key] = t;
  } else {
    auto layout = flat_layout::create(specs, old_ranks);
    REQUIRE(layout.has_value());
    saved_partitions all = must_index({optim::saved_partition_of(whole)});
    for (std::uint32_t r = 0; r < old_ranks; ++r) {
      auto st = all.partition(*layout, r);
      REQUIRE(st.has_value());
      st->master = tensor(); // the rank files hold moments only
      for (const auto& [key, t] : optim::partition_payload(*layout, r, *st))
        c.groups["optimizer_0_rank" + std::to_string(r)][key] = t.clone();
    }
  }
  auto saved = ckpt::save_checkpoint(root, c);
  REQUIRE_MESSAGE(saved.has_value(), saved.err().to_string());
  return saved->dir;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

} // namespace

TEST_CASE("a ZeRO resume reads only its partition's ranges of the optimizer and model files, bit for bit") {
  const auto specs = awkward_specs();
  const state_map whole = whole_state(specs);
  std::int64_t stage_numel = 0;
  for (const auto& s : specs) stage_numel += shape_numel(s.shape);
  saved_partitions reference = must_index({optim::saved_partition_of(whole)});
  for (auto [old_ranks, new_ranks] : {std::pair<std::uint32_t, std::uint32_t>{4, 2}, {2, 4}, {0, 2}, {3, 1}}) {
    CAPTURE(old_ranks);
    CAPTURE(new_ranks);
    test::scratch_dir root;
    const std::string dir = save(root.path(), specs, whole, old_ranks);
    auto manifest = ckpt::verify_checkpoint(dir);
    REQUIRE(manifest.has_value());
    auto layout = flat_layout::create(specs, new_ranks);
    REQUIRE(layout.has_value());
    for (std::uint32_t r = 0; r < new_ranks; ++r) {
      CAPTURE(r);
      memory_reset_peak(device::cpu());
      const std::int64_t before = memory_usage_of(device::cpu()).current_bytes;
      auto sources = train::open_stage_sources(dir, *manifest, 0);
      REQUIRE_MESSAGE(sources.has_value(), sources.err().to_string());
      auto mine = must_index(sources->parts).partition(*layout, r);
      REQUIRE_MESSAGE(mine.has_value(), mine.err().to_string());
      const std::int64_t peak = memory_usage_of(device::cpu()).peak_bytes - before;

      std::int64_t own = 0, largest = 0;
      for (const auto& p : layout->pieces(layout->partition(r))) {
        own += p.count;
        largest = std::max(largest, p.count);
      }
      // Masters, exp_avg and exp_avg_sq of the partition's elements, and the small i64
      // records (step counts, shapes; the first file's step count twice).
      std::uint64_t records = 8;
      for (const auto& reader : sources->readers)
        for (const auto& [name, e] : reader->header().tensors)
          if (e.dtype_tag == "I64") records += e.end - e.begin;
      CHECK(sources->bytes_read() == static_cast<std::uint64_t>(12 * own) + records);
      if (new_ranks > 1) CHECK(sources->bytes_read() < static_cast<std::uint64_t>(12 * stage_numel));
      // The partition's three arrays plus one read buffer, never a whole stage.
      CHECK(peak <= 12 * layout->partition_numel() + 4 * largest + 1024);
      if (new_ranks > 1) CHECK(peak < 12 * stage_numel);

      auto expected_state = reference.partition(*layout, r);
      REQUIRE(expected_state.has_value());
      check_same_partition(*mine, *expected_state);
      CHECK(mine->step == 5);
    }
  }
}

TEST_CASE("a ZeRO resume from short or missing files fails naming the file and tensor") {
  const auto specs = awkward_specs();
  test::scratch_dir root;
  const std::string dir = save(root.path(), specs, whole_state(specs), 2);
  auto manifest = ckpt::verify_checkpoint(dir);
  REQUIRE(manifest.has_value());
  const std::string rank1 = dir + "/optimizer_0_rank1.safetensors";

  SUBCASE("a rank file cut short: its size differs from the manifest's") {
    fs::resize_file(rank1, fs::file_size(rank1) - 100);
    auto s = train::open_stage_sources(dir, *manifest, 0);
    REQUIRE_FALSE(s.has_value());
    CHECK(contains(s.err().message, "optimizer_0_rank1.safetensors"));
    CHECK(contains(s.err().message, "manifest"));
  }
  SUBCASE("a rank file cut short after it was opened: the range read names the file and tensor") {
    auto s = train::open_stage_sources(dir, *manifest, 0);
    REQUIRE(s.has_value());
    saved_partitions index = must_index(s->parts);
    // Rank 1's moments lie first in its data section (name order): keep 16 bytes of them.
    fs::resize_file(rank1, s->readers[1]->header().data_offset + 16);
    auto layout = flat_layout::create(specs, 1);
    REQUIRE(layout.has_value());
    auto part = index.partition(*layout, 0);
    REQUIRE_FALSE(part.has_value());
    CHECK(contains(part.err().message, "optimizer_0_rank1.safetensors"));
    CHECK(contains(part.err().message, "short read"));
    CHECK(contains(part.err().message, "reading tensor 'bert."));
  }
  SUBCASE("a rank's file left out of the manifest: the uncovered tensor is named") {
    ckpt::checkpoint_manifest less = *manifest;
    less.files.erase(std::remove_if(less.files.begin(), less.files.end(),
                                    [](const ckpt::checkpoint_file& f) { return f.group == "optimizer_0_rank1"; }),
                     less.files.end());
    auto s = train::open_stage_sources(dir, less, 0);
    REQUIRE(s.has_value());
    auto index = saved_partitions::index(s->parts);
    REQUIRE_FALSE(index.has_value());
    CHECK(contains(index.err().message, "missing"));
    CHECK(contains(index.err().message, "bert."));
  }
  SUBCASE("no optimizer files for the stage") {
    auto s = train::open_stage_sources(dir, *manifest, 1);
    REQUIRE_FALSE(s.has_value());
    CHECK(contains(s.err().message, "no optimizer state for stage 1"));
  }
}
