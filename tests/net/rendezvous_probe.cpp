// A small job process for the rendezvous and launcher tests: prints its environment, joins
// the rendezvous named by it (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, DSA_JOB_TOKEN),
// then does what its flags say. Exit codes: 0 left cleanly, 1 saw the job lost, 2 bad
// environment or flags, 4 the join failed, 5 waited for a loss that never came, or the
// code --exit-code names.
//
//   --config KEY=VALUE        a config-summary entry (repeatable)
//   --no-join                 print the environment and exit 0
//   --exit-rank R --exit-code C   rank R exits with C right after joining, without leave
//   --hang-rank R             rank R blocks after joining until it is killed (heartbeats go on)
//   --wait-lost               the other ranks wait (at most 120 s) until the job is lost
//   --heartbeat-interval-ms N, --heartbeat-timeout-ms N
#include "io/net/rendezvous_env.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include <unistd.h>

namespace {

std::string text_of(const dsa::net::bytes& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

dsa::net::bytes bytes_of(const std::string& s) {
  auto* p = reinterpret_cast<const std::byte*>(s.data());
  return dsa::net::bytes(p, p + s.size());
}

std::string joined_texts(const std::vector<dsa::net::bytes>& blobs) {
  std::string out;
  for (const auto& b : blobs)
    out += (out.empty() ? "" : ",") + text_of(b);
  return out;
}

void say(std::FILE* to, const std::string& line) {
  std::fputs((line + "\n").c_str(), to); // one write per line: ranks share a terminal
  std::fflush(to);
}

} // namespace

int main(int argc, char** argv) {
  using namespace dsa;
  net::config_summary config;
  std::optional<std::chrono::milliseconds> interval, timeout;
  bool join = true, wait_lost = false;
  int exit_rank = -1, exit_code = 0, hang_rank = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        say(stderr, "probe: " + a + " needs a value");
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--config") {
      std::string kv = value();
      auto eq = kv.find('=');
      config[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
    } else if (a == "--no-join") {
      join = false;
    } else if (a == "--exit-rank") {
      exit_rank = std::atoi(value().c_str());
    } else if (a == "--exit-code") {
      exit_code = std::atoi(value().c_str());
    } else if (a == "--hang-rank") {
      hang_rank = std::atoi(value().c_str());
    } else if (a == "--wait-lost") {
      wait_lost = true;
    } else if (a == "--heartbeat-interval-ms") {
      interval = std::chrono::milliseconds(std::atoi(value().c_str()));
    } else if (a == "--heartbeat-timeout-ms") {
      timeout = std::chrono::milliseconds(std::atoi(value().c_str()));
    } else {
      say(stderr, "probe: unknown argument " + a);
      return 2;
    }
  }

  auto env = net::read_rendezvous_env();
  if (!env || !*env) {
    say(stderr, "probe: " + (env ? std::string("WORLD_SIZE is not set") : env.err().to_string()));
    return 2;
  }
  const net::rendezvous_env& e = **env;
  say(stdout, fmt::format("env RANK={} LOCAL_RANK={} WORLD_SIZE={} LOCAL_SIZE={} MASTER_ADDR={} "
                          "MASTER_PORT={} TOKEN_CHARS={} PID={}",
                          e.rank, e.local_rank, e.world_size, e.local_size.value_or(-1),
                          e.master_addr, e.master_port, e.job_token.size(), ::getpid()));
  say(stderr, fmt::format("probe rank {} writes this to stderr", e.rank));
  if (!join)
    return 0;

  net::rendezvous_options options = net::make_rendezvous_options(e);
  options.heartbeat_interval = interval.value_or(options.heartbeat_interval);
  options.heartbeat_timeout = timeout.value_or(options.heartbeat_timeout);
  auto client = net::rendezvous_client::join(
      net::make_join_request(e, config, bytes_of(fmt::format("blob{}", e.rank))), options);
  if (!client) {
    say(stderr, "join failed: " + client.err().to_string());
    return 4;
  }
  say(stdout, "joined: " + joined_texts((*client)->blobs()));
  auto gathered = (*client)->allgather("probe", bytes_of(fmt::format("g{}", e.rank)));
  if (!gathered) {
    say(stderr, "allgather failed: " + gathered.err().to_string());
    return 1;
  }
  say(stdout, "gathered: " + joined_texts(*gathered));

  if (e.rank == exit_rank)
    std::_Exit(exit_code); // no leave, no destructors: like a crash with that code
  if (e.rank == hang_rank) {
    say(stdout, "hanging");
    for (;;)
      ::pause();
  }
  if (wait_lost) {
    auto lost = (*client)->wait_lost(std::chrono::seconds(120));
    if (!lost) {
      say(stderr, "no loss seen within 120 s");
      return 5;
    }
    say(stderr, "lost: " + lost->message);
    return 1;
  }
  if (auto left = (*client)->leave(); !left) {
    say(stderr, "leave failed: " + left.err().to_string());
    return 1;
  }
  say(stdout, "left");
  return 0;
}
