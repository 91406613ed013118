// Process identity (hostname, boot id, pid namespace) and pidfd-based exit detection.
#include "io/net/process_watch.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace dsa::net {

namespace {

constexpr std::uint32_t identity_magic = 0x58415344u; // "DSAX"

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

} // namespace

process_identity this_process() {
  process_identity who;
  who.pid = static_cast<int>(::getpid());
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  char ns[256] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  who.host_key = std::string(host) + "|" + read_first_line("/proc/sys/kernel/random/boot_id") +
                 "|" + (n > 0 ? std::string(ns, static_cast<std::size_t>(n)) : std::string());
  return who;
}

bytes wrap_with_identity(const process_identity& who, const bytes& payload) {
  const auto key_len = static_cast<std::uint32_t>(who.host_key.size());
  const std::int32_t pid = who.pid;
  bytes blob(12 + key_len);
  std::memcpy(blob.data(), &identity_magic, 4);
  std::memcpy(blob.data() + 4, &pid, 4);
  std::memcpy(blob.data() + 8, &key_len, 4);
  std::memcpy(blob.data() + 12, who.host_key.data(), key_len);
  blob.insert(blob.end(), payload.begin(), payload.end());
  return blob;
}

expected<std::pair<process_identity, bytes>> unwrap_identity(const bytes& blob) {
  std::uint32_t magic = 0, key_len = 0;
  std::int32_t pid = 0;
  if (blob.size() >= 12) {
    std::memcpy(&magic, blob.data(), 4);
    std::memcpy(&pid, blob.data() + 4, 4);
    std::memcpy(&key_len, blob.data() + 8, 4);
  }
  if (blob.size() < 12 || magic != identity_magic || blob.size() - 12 < key_len)
    return make_error(errc::protocol, "a {}-byte address that ucx_transport::local_address did "
                                      "not make", blob.size());
  process_identity who;
  who.pid = pid;
  who.host_key.assign(reinterpret_cast<const char*>(blob.data()) + 12, key_len);
  bytes payload(blob.begin() + 12 + static_cast<std::ptrdiff_t>(key_len), blob.end());
  return std::make_pair(std::move(who), std::move(payload));
}

process_watch::~process_watch() {
  for (auto& w : watched_)
    ::close(w.fd);
}

status process_watch::add(int rank, int pid) {
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0)
    return make_error(errc::runtime, "cannot watch rank {}'s process {}: pidfd_open: {}", rank,
                      pid, std::strerror(errno));
  watched_.push_back(watched{rank, pid, static_cast<int>(fd)});
  return {};
}

std::vector<int> process_watch::exited() {
  std::vector<int> gone;
  if (watched_.empty())
    return gone;
  std::vector<pollfd> fds;
  for (auto& w : watched_)
    fds.push_back(pollfd{w.fd, POLLIN, 0});
  if (::poll(fds.data(), fds.size(), 0) <= 0)
    return gone;
  std::vector<watched> still;
  for (std::size_t i = 0; i < watched_.size(); ++i) {
    if (fds[i].revents != 0) {
      gone.push_back(watched_[i].rank);
      ::close(watched_[i].fd);
    } else {
      still.push_back(watched_[i]);
    }
  }
  watched_ = std::move(still);
  return gone;
}

} // namespace dsa::net
