// Corrupt checkpoints: each damage gives its own error, naming the checkpoint
// directory and the file at fault, and is caught by the checksum pass before
// any tensor is parsed.
#include "io/ckpt/checkpoint_dir.hpp"
#include "tests/io/io_test_util.hpp"
#include "tests/io/test_checkpoint_dir_util.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <functional>

using namespace dsa;
using namespace dsa::ckpt;
using dsa::test::contains;
using dsa::test::read_raw;
using dsa::test::sample_contents;
using dsa::test::scratch_dir;
using dsa::test::write_raw;

namespace {

// A root with one good checkpoint (step 12); `dir` is its directory.
struct fixture {
  scratch_dir scratch;
  std::string root = scratch.path();
  std::string dir;
  fixture() {
    auto saved = save_checkpoint(root, sample_contents(12));
    REQUIRE(saved);
    dir = saved->dir;
  }
  std::string file(const std::string& name) const { return dir + "/" + name; }
  void flip_byte(const std::string& name, std::size_t offset) const {
    std::string bytes = read_raw(file(name));
    REQUIRE(offset < bytes.size());
    bytes[offset] = static_cast<char>(bytes[offset] ^ 0x01);
    write_raw(file(name), bytes);
  }
  void edit_manifest(const std::function<void(nlohmann::json&)>& edit) const {
    nlohmann::json doc = nlohmann::json::parse(read_raw(file("manifest.json")));
    edit(doc);
    write_raw(file("manifest.json"), doc.dump());
  }
};

// load(latest) and verify_checkpoint fail alike with `code`, naming the
// directory and every part of `parts`.
void check_fails(const fixture& f, errc code, const std::vector<std::string>& parts) {
  auto loaded = load_checkpoint(f.root, "latest");
  REQUIRE_FALSE(loaded);
  auto verified = verify_checkpoint(f.dir);
  REQUIRE_FALSE(verified);
  for (const error& e : {loaded.err(), verified.err()}) {
    CAPTURE(e.to_string());
    CHECK(e.code == code);
    CHECK(contains(e.message, f.dir));
    for (const std::string& part : parts)
      CHECK(contains(e.message, part));
  }
}

} // namespace

TEST_CASE("an intact checkpoint verifies") {
  fixture f;
  auto m = verify_checkpoint(f.dir);
  REQUIRE(m);
  CHECK(m->step == 12);
  CHECK(m->files.size() == 4);
}

TEST_CASE("a flipped byte in the tensor data is a checksum mismatch") {
  fixture f;
  std::size_t last = read_raw(f.file("model.safetensors")).size() - 1;
  f.flip_byte("model.safetensors", last);
  check_fails(f, errc::format, {"checksum mismatch", "model.safetensors"});
}

TEST_CASE("a flipped byte in a safetensors header is caught by the checksum before parsing") {
  fixture f;
  f.flip_byte("optimizer_0.safetensors", 9); // inside the JSON header: '"' becomes '#'
  check_fails(f, errc::format, {"checksum mismatch", "optimizer_0.safetensors"});
}

TEST_CASE("a truncated file is a size mismatch") {
  fixture f;
  std::filesystem::resize_file(f.file("optimizer_0.safetensors"),
                               std::filesystem::file_size(f.file("optimizer_0.safetensors")) - 3);
  check_fails(f, errc::format, {"size mismatch", "optimizer_0.safetensors"});
}

TEST_CASE("a deleted file is a missing file") {
  fixture f;
  std::filesystem::remove(f.file("optimizer_1.safetensors"));
  check_fails(f, errc::not_found, {"missing file", "optimizer_1.safetensors"});

  SUBCASE("groups whose files are intact still load on their own") {
    load_options only;
    only.groups = {"model"};
    auto loaded = load_checkpoint_dir(f.dir, only);
    REQUIRE(loaded);
    dsa::test::check_groups_equal(loaded->groups, {{"model", sample_contents(12).groups["model"]}});
  }
}

TEST_CASE("a deleted manifest is a missing manifest.json") {
  fixture f;
  std::filesystem::remove(f.file("manifest.json"));
  check_fails(f, errc::not_found, {"missing file", "manifest.json"});
}

TEST_CASE("a garbage manifest is a corrupt manifest") {
  fixture f;
  for (const std::string& garbage :
       {std::string("{\"format\": \"dsactor-chec"), std::string("\x00\x01\x02", 3),
        std::string("[1, 2, 3]"), std::string("")}) {
    CAPTURE(garbage);
    write_raw(f.file("manifest.json"), garbage);
    check_fails(f, errc::format, {"corrupt manifest", "manifest.json"});
  }
}

TEST_CASE("malformed manifest fields are named") {
  struct row {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* names;
  };
  const std::vector<row> rows = {
      {"format tag", [](nlohmann::json& d) { d["format"] = "other"; }, "format"},
      {"no step", [](nlohmann::json& d) { d.erase("step"); }, "'step'"},
      {"negative samples", [](nlohmann::json& d) { d["global_samples"] = -1; }, "global_samples"},
      {"state not object", [](nlohmann::json& d) { d["state"] = 3; }, "'state'"},
      {"files not array", [](nlohmann::json& d) { d["files"] = "x"; }, "'files'"},
      {"bad crc text", [](nlohmann::json& d) { d["files"][0]["crc32c"] = "xyz"; }, "crc32c"},
      {"path in name", [](nlohmann::json& d) { d["files"][0]["name"] = "../model.safetensors"; },
       "../model"},
      {"group twice", [](nlohmann::json& d) { d["files"][1] = d["files"][0]; }, "twice"},
      {"checksum kind", [](nlohmann::json& d) { d["checksum"] = "md5"; }, "md5"},
  };
  for (const row& r : rows) {
    CAPTURE(r.what);
    fixture f;
    f.edit_manifest(r.edit);
    check_fails(f, errc::format, {"corrupt manifest", r.names});
  }
}

TEST_CASE("a manifest whose step differs from its directory name is refused") {
  fixture f;
  f.edit_manifest([](nlohmann::json& d) { d["step"] = 13; });
  check_fails(f, errc::format, {"says step 13"});
}

TEST_CASE("an unknown format version is named") {
  fixture f;
  f.edit_manifest([](nlohmann::json& d) { d["format_version"] = 2; });
  check_fails(f, errc::unsupported, {"unknown format_version 2", "reads version 1"});
}

TEST_CASE("a wrong checksum or size in the manifest is a mismatch") {
  fixture f;
  f.edit_manifest([](nlohmann::json& d) { d["files"][2]["crc32c"] = "00000000"; });
  std::string name = nlohmann::json::parse(read_raw(f.file("manifest.json")))["files"][2]["name"];
  check_fails(f, errc::format, {"checksum mismatch", name});
  f.edit_manifest([](nlohmann::json& d) { d["files"][2]["bytes"] = 1; });
  check_fails(f, errc::format, {"size mismatch", name});
}

TEST_CASE("a damaged latest file is named") {
  fixture f;
  write_raw(f.root + "/latest", "../../etc\n");
  auto bad = load_checkpoint(f.root, "latest");
  REQUIRE_FALSE(bad);
  CHECK(bad.err().code == errc::format);
  CHECK(contains(bad.err().message, f.root + "/latest"));
  write_raw(f.root + "/latest", "step_00000077\n");
  auto gone = load_checkpoint(f.root, "latest");
  REQUIRE_FALSE(gone);
  CHECK(gone.err().code == errc::not_found);
  CHECK(contains(gone.err().message, "step_00000077"));
}
