// Checkpoints by several writers (ZeRO ranks): groups staged by each writer, committed
// by one save that lists them; what a crash between staging and commit leaves behind.
#include "io/ckpt/checkpoint_dir.hpp"
#include "tests/io/io_test_util.hpp"
#include "tests/io/test_checkpoint_dir_util.hpp"

#include <doctest/doctest.h>

#include <filesystem>

using namespace dsa;
using namespace dsa::ckpt;
using dsa::test::check_groups_equal;
using dsa::test::read_raw;
using dsa::test::sample_contents;
using dsa::test::scratch_dir;

namespace {

// Splits a sample's groups: "model" stays with the committing writer, the others are
// staged as if by other ranks.
struct split_contents {
  checkpoint_contents own;
  tensor_groups staged;
};

split_contents split(std::uint64_t step) {
  split_contents s;
  s.own = sample_contents(step);
  for (auto it = s.own.groups.begin(); it != s.own.groups.end();) {
    if (it->first == "model") {
      ++it;
      continue;
    }
    s.staged.insert(*it);
    it = s.own.groups.erase(it);
  }
  return s;
}

std::vector<checkpoint_file> stage_all(const std::string& root, std::uint64_t step, const tensor_groups& groups) {
  std::vector<checkpoint_file> files;
  for (const auto& [group, tensors] : groups) {
    auto f = stage_group(root, step, group, tensors);
    REQUIRE_MESSAGE(f.has_value(), (f.has_value() ? "" : f.err().message));
    files.push_back(*f);
  }
  return files;
}

} // namespace

TEST_CASE("staged groups and the committing writer's own form one checkpoint, loaded bit for bit") {
  scratch_dir dir;
  const std::string root = dir.file("ckpt");
  auto parts = split(7);
  REQUIRE(parts.staged.size() >= 2);
  save_options o;
  o.staged = stage_all(root, 7, parts.staged);
  // Until the commit, readers see nothing new.
  CHECK(std::filesystem::is_directory(staging_dir(root, 7)));
  CHECK_FALSE(load_checkpoint(root, "latest").has_value());
  auto saved = save_checkpoint(root, parts.own, o);
  REQUIRE_MESSAGE(saved.has_value(), (saved.has_value() ? "" : saved.err().message));
  CHECK_FALSE(std::filesystem::exists(staging_dir(root, 7)));
  CHECK(read_raw(root + "/latest") == "step_00000007\n");
  auto loaded = load_checkpoint(root, "latest");
  REQUIRE(loaded.has_value());
  check_groups_equal(loaded->groups, sample_contents(7).groups);
  // The manifest lists every file, in group order, with what reached the disk.
  REQUIRE(loaded->manifest.files.size() == 1 + parts.staged.size());
  for (std::size_t i = 1; i < loaded->manifest.files.size(); ++i)
    CHECK(loaded->manifest.files[i - 1].group < loaded->manifest.files[i].group);
  CHECK(verify_checkpoint(saved->dir).has_value());
}

TEST_CASE("a commit refuses a staged file that is missing or of another size, and leaves latest alone") {
  scratch_dir dir;
  const std::string root = dir.file("ckpt");
  auto first = split(1);
  save_options o;
  o.staged = stage_all(root, 1, first.staged);
  REQUIRE(save_checkpoint(root, first.own, o).has_value());
  auto parts = split(2);
  o.staged = stage_all(root, 2, parts.staged);
  SUBCASE("missing") {
    std::filesystem::remove(staging_dir(root, 2) + "/" + o.staged.front().name);
    auto saved = save_checkpoint(root, parts.own, o);
    REQUIRE_FALSE(saved.has_value());
    CHECK(saved.err().message.find(o.staged.front().name) != std::string::npos);
    CHECK(saved.err().message.find("missing") != std::string::npos);
  }
  SUBCASE("another size") {
    o.staged.back().bytes += 1;
    auto saved = save_checkpoint(root, parts.own, o);
    REQUIRE_FALSE(saved.has_value());
    CHECK(saved.err().message.find(o.staged.back().name) != std::string::npos);
  }
  CHECK(read_raw(root + "/latest") == "step_00000001\n");
  CHECK_FALSE(std::filesystem::exists(root + "/step_00000002"));
}

TEST_CASE("a crash between staging and commit: files of other writers are cleared, the folder of an earlier step goes") {
  scratch_dir dir;
  const std::string root = dir.file("ckpt");
  // Step 3 staged, never committed (the job died); a stray file from a run with more ranks.
  auto dead = split(3);
  (void)stage_all(root, 3, dead.staged);
  auto parts = split(5);
  save_options o;
  o.staged = stage_all(root, 5, parts.staged);
  dsa::test::write_raw(staging_dir(root, 5) + "/optimizer_0_rank7.safetensors", "from an earlier run");
  auto saved = save_checkpoint(root, parts.own, o);
  REQUIRE(saved.has_value());
  CHECK_FALSE(std::filesystem::exists(staging_dir(root, 3)));
  CHECK_FALSE(std::filesystem::exists(saved->dir + "/optimizer_0_rank7.safetensors"));
  CHECK(verify_checkpoint(saved->dir).has_value());
}
