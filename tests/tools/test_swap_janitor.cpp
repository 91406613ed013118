// The launcher's sweep of the swap folders its ranks registered (tools/launch/swap_janitor.hpp):
// a folder whose rank is gone (its lock free) is removed with its lock and the job's folder
// when empty; a live rank's (its lock held) is left alone; entries that are not a rank's are
// dropped.
#include "core/file_lock.hpp"
#include "tools/launch/swap_janitor.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace {

namespace fs = std::filesystem;

// A rank's swap folder with a file in it, its lock, and its registry entry.
void make_rank(const fs::path& registry, const fs::path& job, int rank) {
  const fs::path dir = job / ("rank" + std::to_string(rank));
  fs::create_directories(dir);
  std::ofstream(dir / "stage0.master.swp") << "state";
  std::ofstream(job / ("rank" + std::to_string(rank) + ".lock")) << "";
  std::ofstream(registry / ("rank" + std::to_string(rank) + "-0"))
      << (job / ("rank" + std::to_string(rank) + ".lock")).string() << "\n" << dir.string() << "\n" << job.string() << "\n";
}

} // namespace

TEST_CASE("the launcher removes the swap folders of ranks that are gone, never a live rank's") {
  const fs::path root = fs::temp_directory_path() / ("dsa-janitor-" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path registry = root / "registry", job = root / "nvme" / "run-1234";
  fs::create_directories(registry);
  make_rank(registry, job, 0);
  make_rank(registry, job, 1);
  std::ofstream(registry / "rank2-0.tmp.99") << "half"; // a rank killed while writing its entry
  std::ofstream(registry / "rank3-0") << "one line";  // not an entry a rank wrote
  // Rank 0 is alive: it holds its lock.
  auto held = dsa::try_lock_file((job / "rank0.lock").string());
  REQUIRE(held.has_value());
  REQUIRE(*held >= 0);

  auto removed = dsa::tools::sweep_swap_registry(registry.string());
  REQUIRE(removed.size() == 1);
  CHECK(removed[0] == "rank 1's swap files in " + (job / "rank1").string());
  CHECK_FALSE(fs::exists(job / "rank1"));
  CHECK_FALSE(fs::exists(job / "rank1.lock"));
  CHECK_FALSE(fs::exists(registry / "rank1-0"));
  CHECK(fs::exists(job / "rank0" / "stage0.master.swp"));
  CHECK(fs::exists(registry / "rank0-0"));
  CHECK_FALSE(fs::exists(registry / "rank2-0.tmp.99"));
  CHECK_FALSE(fs::exists(registry / "rank3-0"));
  CHECK(fs::exists(job)); // rank 0's folder is still in it

  // Rank 0 ends without removing its folder (killed): the next sweep takes it and the job's folder.
  ::close(*held);
  removed = dsa::tools::sweep_swap_registry(registry.string());
  REQUIRE(removed.size() == 1);
  CHECK_FALSE(fs::exists(job));
  CHECK(fs::is_empty(registry));
  // A rank that removed its folder itself leaves only its entry: dropped, nothing reported.
  make_rank(registry, job, 4);
  fs::remove_all(job / "rank4");
  fs::remove(job / "rank4.lock");
  CHECK(dsa::tools::sweep_swap_registry(registry.string()).empty());
  CHECK(fs::is_empty(registry));
  fs::remove_all(root);
}
