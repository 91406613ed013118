// Helpers for the rendezvous tests: a server event log to wait on, joining from threads, and
// starting the rendezvous_probe program as a real process with a launcher's environment.
#pragma once

#include "io/net/rendezvous_client.hpp"
#include "io/net/rendezvous_server.hpp"

#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

namespace dsa::test {

// Generous bounds: a loaded 2-core machine may be slow, and they only matter on failure.
inline constexpr std::chrono::seconds wait_bound{30};
inline const std::string test_token = "0123456789abcdef0123456789abcdef";

net::bytes bytes_of(const std::string& s);
std::string text_of(const net::bytes& b);

// Records the server's events; wait_for blocks (at most `bound`) until one of `kind` came.
class event_log {
public:
  net::rendezvous_server::event_callback callback();
  std::optional<net::server_event> wait_for(net::server_event::kind kind,
                                            std::chrono::milliseconds bound = wait_bound);

private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<net::server_event> events_;
};

// A request for `rank` of `world` to the server on 127.0.0.1:port, blob "blob<rank>".
net::join_request request_for(int port, int rank, int world,
                              net::config_summary config = {{"train_steps", "4"}});

// Joins every rank of `world` from its own thread; returns each rank's result.
std::vector<expected<std::unique_ptr<net::rendezvous_client>>>
join_all(int port, int world, net::rendezvous_options options = {});

// A running rendezvous_probe (tests/net/rendezvous_probe.cpp) for `rank`; its stdout goes to
// /dev/null, its stderr is inherited. The destructor kills it (SIGKILL) if it still runs.
class probe_process {
public:
  probe_process(int port, int rank, int world, const std::vector<std::string>& args,
                const std::string& token = test_token);
  ~probe_process();
  pid_t pid() const { return pid_; }
  // The wait status once the process ended, nullopt if it did not within `bound`.
  std::optional<int> wait_exit(std::chrono::milliseconds bound = wait_bound);

private:
  pid_t pid_ = -1;
  std::future<int> status_;
};

} // namespace dsa::test
