// The swap files of ranks that died; see swap_janitor.hpp.
#include "tools/launch/swap_janitor.hpp"

#include "core/file_lock.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

namespace dsa::tools {

namespace fs = std::filesystem;

std::vector<std::string> sweep_swap_registry(const std::string& registry) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (registry.empty() || !fs::is_directory(registry, ec)) return removed;
  for (const auto& e : fs::directory_iterator(registry, ec)) {
    const std::string name = e.path().filename().string();
    int rank = -1, area = -1;
    if (std::sscanf(name.c_str(), "rank%d-%d", &rank, &area) != 2 || name != fmt::format("rank{}-{}", rank, area)) {
      fs::remove(e.path(), ec); // a rank killed while it wrote its entry (rankN-K.tmp.PID)
      continue;
    }
    std::ifstream in(e.path());
    std::string lock, dir, job;
    if (!std::getline(in, lock) || !std::getline(in, dir) || !std::getline(in, job) || lock.empty() || dir.empty()) {
      fs::remove(e.path(), ec); // not an entry a rank wrote
      continue;
    }
    if (!fs::exists(lock, ec)) { // its rank removed the folder and the lock itself
      fs::remove(e.path(), ec);
      continue;
    }
    const bool had_files = fs::exists(dir, ec);
    if (!remove_unowned_folder(lock, dir)) continue; // its rank is alive: not ours to touch
    if (!job.empty()) fs::remove(job, ec); // only when empty: other ranks may still be there
    fs::remove(e.path(), ec);
    if (had_files) removed.push_back(fmt::format("rank {}'s swap files in {}", rank, dir));
  }
  return removed;
}

swap_janitor::swap_janitor(bool enabled) {
  if (!enabled) return;
  std::error_code ec;
  std::string pattern = (fs::temp_directory_path(ec) / "dsactor-launch-XXXXXX").string();
  if (ec || ::mkdtemp(pattern.data()) == nullptr) return;
  registry_ = pattern;
  ::setenv("DSA_LAUNCH_SWAP_REGISTRY", registry_.c_str(), 1);
}

swap_janitor::~swap_janitor() {
  if (registry_.empty()) return;
  (void)sweep();
  std::error_code ec;
  fs::remove_all(registry_, ec);
}

std::vector<std::string> swap_janitor::sweep() { return sweep_swap_registry(registry_); }

} // namespace dsa::tools
