// Who a rank's process is on its host, and a watch that notices when a process of this
// host exits. ucx_transport prefixes its UCX worker address with the identity, so
// ranks on one host watch each other directly (a pidfd turns readable when the process
// ends, reaped or not) instead of waiting on UCX's shared-memory keepalive, which in
// 1.13 did not notice a killed peer within a minute here.
#pragma once

#include "io/net/transport.hpp"

#include <string>
#include <utility>
#include <vector>

namespace dsa::net {

struct process_identity {
  int pid = 0;
  // Equal for two processes exactly when their pids are comparable: host name, boot id
  // and pid namespace.
  std::string host_key;
};

process_identity this_process();

// blob = identity + payload (a UCX worker address), and back. unwrap fails with
// errc::protocol on a blob that was not made by wrap.
bytes wrap_with_identity(const process_identity& who, const bytes& payload);
expected<std::pair<process_identity, bytes>> unwrap_identity(const bytes& blob);

// Processes of this host by rank. Not thread-safe: one owner thread.
class process_watch {
public:
  process_watch() = default;
  process_watch(const process_watch&) = delete;
  process_watch& operator=(const process_watch&) = delete;
  ~process_watch();

  // Starts watching `pid` for `rank`; an error when the process cannot be watched (it
  // is already gone, or pidfd_open is not available).
  status add(int rank, int pid);
  // The ranks whose process has exited since the last call (each reported once).
  std::vector<int> exited();

private:
  struct watched {
    int rank;
    int pid;
    int fd;
  };
  std::vector<watched> watched_;
};

} // namespace dsa::net
