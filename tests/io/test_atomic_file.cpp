// Atomic file replacement: the target holds the old or the new bytes, never a
// mix; no temporary file survives; failures name the path and leave the target alone.
#include "io/ckpt/atomic_file.hpp"
#include "tests/io/io_test_util.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>

#include <filesystem>

using namespace dsa;
using namespace dsa::ckpt;
using dsa::test::read_raw;
using dsa::test::scratch_dir;
using dsa::test::write_raw;

namespace {
bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}
} // namespace

TEST_CASE("atomic write creates and replaces a file and leaves no temporary file") {
  scratch_dir dir;
  std::string path = dir.file("manifest.json");
  REQUIRE(write_file_atomic(path, "first"));
  CHECK(read_raw(path) == "first");
  REQUIRE(write_file_atomic(path, std::string("second\0with nul", 15)));
  CHECK(read_raw(path) == std::string("second\0with nul", 15));
  REQUIRE(write_file_atomic(path, ""));
  CHECK(read_raw(path).empty());
  CHECK(dir.entries() == std::vector<std::string>{"manifest.json"});
}

TEST_CASE("atomic write streams in pieces through the temporary name") {
  scratch_dir dir;
  std::string path = dir.file("shard.bin");
  write_raw(path, "old");
  auto file = atomic_file::create(path);
  REQUIRE(file);
  CHECK(file->temp_path() == path + ".tmp." + std::to_string(::getpid()));
  REQUIRE(file->write("abc"));
  REQUIRE(file->write("def", 3));
  CHECK(file->bytes_written() == 6);
  CHECK(read_raw(path) == "old"); // nothing visible before commit
  CHECK(std::filesystem::exists(file->temp_path()));
  REQUIRE(file->commit());
  CHECK(read_raw(path) == "abcdef");
  CHECK(dir.entries() == std::vector<std::string>{"shard.bin"});
  auto again = file->commit();
  REQUIRE_FALSE(again);
  CHECK(again.err().code == errc::invalid_argument);
}

TEST_CASE("an atomic write abandoned before commit leaves the target intact") {
  scratch_dir dir;
  std::string path = dir.file("weights.safetensors");
  write_raw(path, "precious");
  {
    auto file = atomic_file::create(path);
    REQUIRE(file);
    REQUIRE(file->write("half-written"));
    atomic_file moved =
        std::move(*file); // the moved-from writer must not remove the moved-to's file
    CHECK(std::filesystem::exists(moved.temp_path()));
  }
  CHECK(read_raw(path) == "precious");
  CHECK(dir.entries() == std::vector<std::string>{"weights.safetensors"});
}

TEST_CASE("atomic write into a missing directory fails cleanly, naming the path") {
  scratch_dir dir;
  std::string path = dir.file("no/such/dir/file.json");
  auto st = write_file_atomic(path, "x");
  REQUIRE_FALSE(st);
  CHECK(st.err().code == errc::io);
  CHECK(contains(st.err().message, path));
  CHECK(contains(st.err().message, "No such file or directory"));
  CHECK(dir.entries().empty());
}

TEST_CASE("a failed rename removes the temporary file and keeps the target") {
  scratch_dir dir;
  std::string path = dir.file("target");
  std::filesystem::create_directory(path);
  write_raw(path + "/inside", "keep");
  auto st = write_file_atomic(path, "new bytes");
  REQUIRE_FALSE(st);
  CHECK(st.err().code == errc::io);
  CHECK(contains(st.err().message, path));
  CHECK(read_raw(path + "/inside") == "keep");
  CHECK(dir.entries() == std::vector<std::string>{"target"});
}

TEST_CASE("a write that fails part-way never replaces the target") {
  // RLIMIT_FSIZE makes write() fail with EFBIG (SIGXFSZ ignored) past the limit:
  // a real short write on any file system.
  scratch_dir dir;
  std::string path = dir.file("checkpoint.bin");
  write_raw(path, "old contents");
  std::string big(1 << 20, 'z');

  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 4096;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);

  auto file = atomic_file::create(path);
  status write_status = file ? file->write(big) : status(file.err());
  status commit_status = file ? file->commit() : status(file.err());

  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, old_handler);

  REQUIRE(file);
  REQUIRE_FALSE(write_status);
  CHECK(write_status.err().code == errc::io);
  CHECK(contains(write_status.err().message, file->temp_path()));
  REQUIRE_FALSE(commit_status);
  CHECK(contains(commit_status.err().message, path));
  CHECK(read_raw(path) == "old contents");
  CHECK(dir.entries() == std::vector<std::string>{"checkpoint.bin"});
}

TEST_CASE("read_file returns the whole file or an error naming it") {
  scratch_dir dir;
  std::string path = dir.file("data.bin");
  std::string bytes;
  for (int i = 0; i < 70001; ++i)
    bytes.push_back(static_cast<char>(i * 7));
  write_raw(path, bytes);
  auto read = read_file(path);
  REQUIRE(read);
  CHECK(*read == bytes);

  write_raw(path, "");
  REQUIRE(read_file(path));
  CHECK(read_file(path)->empty());

  auto missing = read_file(dir.file("absent.json"));
  REQUIRE_FALSE(missing);
  CHECK(missing.err().code == errc::not_found);
  CHECK(contains(missing.err().message, dir.file("absent.json")));

  auto directory = read_file(dir.path());
  REQUIRE_FALSE(directory);
  CHECK(contains(directory.err().message, dir.path()));
}

TEST_CASE("parent_directory") {
  CHECK(parent_directory("a/b/c.json") == "a/b");
  CHECK(parent_directory("c.json") == ".");
  CHECK(parent_directory("/c.json") == "/");
  CHECK(parent_directory("/x/y/") == "/x");
  CHECK(parent_directory("./c") == ".");
}
