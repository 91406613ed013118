// Checkpoint directories: bit-exact round trips, `latest`, keep_last pruning,
// leftovers of interrupted saves, overwrite policy, resolution and group selection.
#include "io/ckpt/checkpoint_dir.hpp"
#include "tests/io/io_test_util.hpp"
#include "tests/io/test_checkpoint_dir_util.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>

using namespace dsa;
using namespace dsa::ckpt;
using dsa::test::check_groups_equal;
using dsa::test::contains;
using dsa::test::read_raw;
using dsa::test::sample_contents;
using dsa::test::scratch_dir;
using dsa::test::write_raw;

namespace {

std::vector<std::uint64_t> steps_of(const std::string& root) {
  auto list = list_checkpoints(root);
  REQUIRE(list);
  std::vector<std::uint64_t> out;
  for (const checkpoint_ref& ref : *list)
    out.push_back(ref.step);
  return out;
}

std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

void save_ok(const std::string& root, const checkpoint_contents& c, const save_options& o = {}) {
  auto saved = save_checkpoint(root, c, o);
  if (!saved)
    FAIL(saved.err().to_string());
}

} // namespace

TEST_CASE("a checkpoint round-trips several groups and the manifest state bit for bit") {
  scratch_dir dir;
  std::string root = dir.file("ckpt");
  checkpoint_contents c = sample_contents(100);
  auto saved = save_checkpoint(root, c);
  REQUIRE(saved);
  CHECK(saved->dir == root + "/step_00000100");
  CHECK(saved->pruned.empty());
  CHECK(entries_of(root) == std::vector<std::string>{"latest", "step_00000100"});
  CHECK(entries_of(saved->dir) ==
        std::vector<std::string>{"manifest.json", "model.safetensors", "optimizer_0.safetensors",
                                 "optimizer_1.safetensors", "rng.safetensors"});
  CHECK(read_raw(root + "/latest") == "step_00000100\n");

  auto loaded = load_checkpoint(root, "latest");
  REQUIRE(loaded);
  CHECK(loaded->dir == saved->dir);
  CHECK(loaded->manifest.format_version == checkpoint_format_version);
  CHECK(loaded->manifest.step == 100);
  CHECK(loaded->manifest.global_samples == 100 * 32 + 7);
  CHECK(loaded->manifest.state == c.state);
  CHECK(loaded->manifest.state["loss_scaler"]["scale"].get<double>() == 65536.0 / 3.0);
  check_groups_equal(loaded->groups, c.groups);
  REQUIRE(loaded->manifest.files.size() == 4);
  for (const checkpoint_file& f : loaded->manifest.files) {
    CAPTURE(f.name);
    CHECK(f.name == f.group + ".safetensors");
    CHECK(f.bytes == std::filesystem::file_size(saved->dir + "/" + f.name));
  }
}

TEST_CASE("the model file is a HuggingFace-style safetensors file") {
  scratch_dir dir;
  auto saved = save_checkpoint(dir.path(), sample_contents(1));
  REQUIRE(saved);
  auto file = read_safetensors(saved->dir + "/model.safetensors");
  REQUIRE(file);
  CHECK(file->metadata == metadata_map{{"format", "pt"}});
  CHECK(file->tensors.count("bert.embeddings.word_embeddings.weight") == 1);
}

TEST_CASE("latest names the newest checkpoint; steps resolve by number, name and path") {
  scratch_dir dir;
  for (std::uint64_t step : {1, 2, 3})
    save_ok(dir.path(), sample_contents(step, step));
  CHECK(read_raw(dir.file("latest")) == "step_00000003\n");
  CHECK(steps_of(dir.path()) == std::vector<std::uint64_t>{1, 2, 3});
  auto latest = load_checkpoint(dir.path(), "latest");
  REQUIRE(latest);
  CHECK(latest->manifest.step == 3);
  check_groups_equal(latest->groups, sample_contents(3, 3).groups);
  for (const std::string& which :
       {std::string("2"), std::string("step_00000002"), dir.file("step_00000002")}) {
    CAPTURE(which);
    auto r = resolve_checkpoint(dir.path(), which);
    REQUIRE(r);
    CHECK(*r == dir.file("step_00000002"));
  }
  auto two = load_checkpoint(dir.path(), "2");
  REQUIRE(two);
  check_groups_equal(two->groups, sample_contents(2, 2).groups);
  CHECK(two->manifest.state == sample_contents(2, 2).state);
}

TEST_CASE("steps past eight digits keep their order") {
  scratch_dir dir;
  save_ok(dir.path(), sample_contents(99999999));
  save_ok(dir.path(), sample_contents(123456789));
  CHECK(steps_of(dir.path()) == std::vector<std::uint64_t>{99999999, 123456789});
  CHECK(read_raw(dir.file("latest")) == "step_123456789\n");
}

TEST_CASE("keep_last prunes the oldest checkpoints and nothing else") {
  scratch_dir dir;
  std::filesystem::create_directory(dir.file("notes"));
  std::filesystem::create_directory(dir.file("step_abc"));
  write_raw(dir.file("step_00000000x"), "not a checkpoint");
  write_raw(dir.file("README"), "mine");
  save_options keep2;
  keep2.keep_last = 2;
  for (std::uint64_t step = 1; step <= 4; ++step) {
    auto saved = save_checkpoint(dir.path(), sample_contents(step * 10), keep2);
    REQUIRE(saved);
    if (step >= 3)
      CHECK(saved->pruned ==
            std::vector<std::string>{dir.file(checkpoint_dir_name(step * 10 - 20))});
  }
  CHECK(steps_of(dir.path()) == std::vector<std::uint64_t>{30, 40});
  CHECK(entries_of(dir.path()) == std::vector<std::string>{"README", "latest", "notes",
                                                           "step_00000000x", "step_00000030",
                                                           "step_00000040", "step_abc"});

  SUBCASE("keep_last = 1 keeps only the one just written, even when it is not the highest") {
    save_options keep1;
    keep1.keep_last = 1;
    keep1.overwrite = overwrite_policy::replace;
    auto saved = save_checkpoint(dir.path(), sample_contents(30, 9), keep1);
    REQUIRE(saved);
    CHECK(steps_of(dir.path()) == std::vector<std::uint64_t>{30});
    CHECK(read_raw(dir.file("latest")) == "step_00000030\n");
  }
  SUBCASE("keep_last = 0 keeps all") {
    save_ok(dir.path(), sample_contents(50));
    save_ok(dir.path(), sample_contents(60));
    CHECK(steps_of(dir.path()) == std::vector<std::uint64_t>{30, 40, 50, 60});
  }
}

TEST_CASE("leftovers of a crashed save do not confuse load(latest) and are cleaned later") {
  scratch_dir dir;
  save_ok(dir.path(), sample_contents(5));
  // Crash after the rename, before `latest` moved: step 7 is complete but unnamed.
  save_ok(dir.path(), sample_contents(7));
  write_raw(dir.file("latest"), "step_00000005\n");
  // Crash while writing step 9: a temporary directory of a dead process.
  std::string dead_tmp = dir.file(".step_00000009.tmp-99999999");
  std::filesystem::create_directory(dead_tmp);
  write_raw(dead_tmp + "/manifest.json", "{\"trunc");
  write_raw(dead_tmp + "/model.safetensors", "half");
  std::string own_tmp = dir.file(".step_00000009.tmp-" + std::to_string(::getpid()));
  std::filesystem::create_directory(own_tmp);
  write_raw(dir.file("latest.tmp.99999999"), "step_000");
  // pid 1 is alive: its temporary directory may still be in use and stays.
  std::string live_tmp = dir.file(".step_00000009.tmp-1");
  std::filesystem::create_directory(live_tmp);
  // A step directory without a manifest (copied by hand, half done) is no checkpoint.
  std::filesystem::create_directory(dir.file("step_00000008"));

  auto loaded = load_checkpoint(dir.path(), "latest");
  REQUIRE(loaded);
  CHECK(loaded->manifest.step == 5);
  check_groups_equal(loaded->groups, sample_contents(5).groups);
  CHECK(steps_of(dir.path()) == std::vector<std::uint64_t>{5, 7});

  save_ok(dir.path(), sample_contents(6));
  CHECK_FALSE(std::filesystem::exists(dead_tmp));
  CHECK_FALSE(std::filesystem::exists(own_tmp));
  CHECK_FALSE(std::filesystem::exists(dir.file("latest.tmp.99999999")));
  CHECK(std::filesystem::exists(live_tmp));
  CHECK(read_raw(dir.file("latest")) == "step_00000006\n");
}

TEST_CASE("an existing step directory is refused unless replacing is asked for") {
  scratch_dir dir;
  save_ok(dir.path(), sample_contents(3, 1));
  auto again = save_checkpoint(dir.path(), sample_contents(3, 2));
  REQUIRE_FALSE(again);
  CHECK(again.err().code == errc::invalid_argument);
  CHECK(contains(again.err().message, dir.file("step_00000003")));
  CHECK(contains(again.err().message, "already exists"));
  auto kept = load_checkpoint(dir.path(), "latest");
  REQUIRE(kept);
  check_groups_equal(kept->groups, sample_contents(3, 1).groups);

  save_options replace;
  replace.overwrite = overwrite_policy::replace;
  save_ok(dir.path(), sample_contents(3, 2), replace);
  auto replaced = load_checkpoint(dir.path(), "latest");
  REQUIRE(replaced);
  check_groups_equal(replaced->groups, sample_contents(3, 2).groups);
  CHECK(replaced->manifest.state == sample_contents(3, 2).state);
  CHECK(entries_of(dir.path()) == std::vector<std::string>{"latest", "step_00000003"});
}

TEST_CASE("a failed save leaves no directory behind and latest unchanged") {
  scratch_dir dir;
  save_ok(dir.path(), sample_contents(1));
  checkpoint_contents bad = sample_contents(2);
  bad.groups["optimizer_1"]["undefined"] = tensor();
  auto saved = save_checkpoint(dir.path(), bad);
  REQUIRE_FALSE(saved);
  CHECK(contains(saved.err().message, "undefined"));
  CHECK(entries_of(dir.path()) == std::vector<std::string>{"latest", "step_00000001"});
  CHECK(read_raw(dir.file("latest")) == "step_00000001\n");
}

TEST_CASE("bad group names and a non-object state are refused before writing") {
  scratch_dir dir;
  for (const std::string& name :
       {std::string("../evil"), std::string(""), std::string("a.b"), std::string(65, 'x')}) {
    CAPTURE(name);
    checkpoint_contents c = sample_contents(1);
    c.groups[name]["t"] = dsa::test::f32_tensor({2}, 1);
    auto saved = save_checkpoint(dir.path(), c);
    REQUIRE_FALSE(saved);
    CHECK(saved.err().code == errc::invalid_argument);
  }
  checkpoint_contents c = sample_contents(1);
  c.state = nlohmann::json::array();
  auto saved = save_checkpoint(dir.path(), c);
  REQUIRE_FALSE(saved);
  CHECK(contains(saved.err().message, "JSON object"));
  CHECK(entries_of(dir.path()).empty());
}

TEST_CASE("load can select groups; an unknown group is named") {
  scratch_dir dir;
  save_ok(dir.path(), sample_contents(4));
  load_options only;
  only.groups = {"optimizer_1", "model"};
  auto loaded = load_checkpoint(dir.path(), "latest", only);
  REQUIRE(loaded);
  CHECK(loaded->groups.size() == 2);
  CHECK(loaded->groups.count("optimizer_1") == 1);
  CHECK(loaded->groups.count("model") == 1);
  only.groups = {"optimizer_7"};
  auto missing = load_checkpoint(dir.path(), "latest", only);
  REQUIRE_FALSE(missing);
  CHECK(missing.err().code == errc::not_found);
  CHECK(contains(missing.err().message, "optimizer_7"));
}

TEST_CASE("resolving names what is missing") {
  scratch_dir dir;
  CHECK(steps_of(dir.file("none")).empty());
  auto none = load_checkpoint(dir.path(), "latest");
  REQUIRE_FALSE(none);
  CHECK(none.err().code == errc::not_found);
  CHECK(contains(none.err().message, dir.file("latest")));
  auto bogus = resolve_checkpoint(dir.path(), "newest");
  REQUIRE_FALSE(bogus);
  CHECK(bogus.err().code == errc::invalid_argument);
  auto absent = resolve_checkpoint(dir.path(), "12");
  REQUIRE_FALSE(absent);
  CHECK(absent.err().code == errc::not_found);
  CHECK(contains(absent.err().message, "step_00000012"));
  CHECK(checkpoint_dir_name(0) == "step_00000000");
}
