// The NVMe swap files of ranks that died: a rank killed (kill -9, the OOM killer, a lost
// host's last SIGKILL) cannot remove its swap folder, and a job that stops there would
// leave gigabytes behind until its next run. The launcher makes a registry folder for its
// host's ranks (DSA_LAUNCH_SWAP_REGISTRY); each rank that opens a swap folder writes an
// entry there, rank<r>-<n> (its lock, its folder, the job's folder:
// actors/train/config/offload_config.hpp)
// and removes it when it removed the folder itself. Once every rank of an attempt has
// ended, the launcher sweeps the registry: a folder whose lock is free (its owner is
// gone) is removed, with its lock and the job's folder when that is empty. Ranks on other
// hosts are not registered: their next run clears what they left.
#pragma once

#include <string>
#include <vector>

namespace dsa::tools {

class swap_janitor {
public:
  // Makes the registry under the system's temporary folder and sets
  // DSA_LAUNCH_SWAP_REGISTRY for the ranks this process starts; an empty janitor (no
  // registry) when `enabled` is false or that fails.
  explicit swap_janitor(bool enabled = true);
  ~swap_janitor(); // sweeps once more, then removes the registry
  swap_janitor(const swap_janitor&) = delete;
  swap_janitor& operator=(const swap_janitor&) = delete;

  // Removes the folders of registered ranks that are gone; what it removed ("rank 1's
  // swap files in DIR"), for the launcher's log.
  std::vector<std::string> sweep();
  const std::string& registry() const { return registry_; }

private:
  std::string registry_;
};

// The sweep over a registry folder (swap_janitor::sweep; tests call it directly).
std::vector<std::string> sweep_swap_registry(const std::string& registry);

} // namespace dsa::tools
