// Helpers for the rendezvous tests; see rendezvous_support.hpp.
#include "tests/net/rendezvous_support.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <thread>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace dsa::test {

net::bytes bytes_of(const std::string& s) {
  auto* p = reinterpret_cast<const std::byte*>(s.data());
  return net::bytes(p, p + s.size());
}

std::string text_of(const net::bytes& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

net::rendezvous_server::event_callback event_log::callback() {
  return [this](const net::server_event& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(e);
    cv_.notify_all();
  };
}

std::optional<net::server_event> event_log::wait_for(net::server_event::kind kind,
                                                     std::chrono::milliseconds bound) {
  std::unique_lock<std::mutex> lock(mutex_);
  std::optional<net::server_event> found;
  cv_.wait_for(lock, bound, [&] {
    for (const auto& e : events_)
      if (e.what == kind) {
        found = e;
        return true;
      }
    return false;
  });
  return found;
}

net::join_request request_for(int port, int rank, int world, net::config_summary config) {
  net::join_request r;
  r.address = "127.0.0.1";
  r.port = port;
  r.job_token = test_token;
  r.rank = rank;
  r.world_size = world;
  r.config = std::move(config);
  r.blob = bytes_of("blob" + std::to_string(rank));
  return r;
}

std::vector<expected<std::unique_ptr<net::rendezvous_client>>>
join_all(int port, int world, net::rendezvous_options options) {
  std::vector<std::optional<expected<std::unique_ptr<net::rendezvous_client>>>> slots(
      static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      slots[static_cast<std::size_t>(r)].emplace(
          net::rendezvous_client::join(request_for(port, r, world), options));
    });
  for (auto& t : threads)
    t.join();
  std::vector<expected<std::unique_ptr<net::rendezvous_client>>> out;
  for (auto& s : slots)
    out.push_back(std::move(*s));
  return out;
}

namespace {

// The probe sits next to the test program in the build tree.
std::string probe_path() {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(n > 0);
  std::string path(self, static_cast<std::size_t>(n));
  return path.substr(0, path.rfind('/')) + "/rendezvous_probe";
}

} // namespace

probe_process::probe_process(int port, int rank, int world, const std::vector<std::string>& args,
                             const std::string& token) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos)
      env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  env["RANK"] = std::to_string(rank);
  env["LOCAL_RANK"] = std::to_string(rank);
  env["WORLD_SIZE"] = std::to_string(world);
  env["LOCAL_SIZE"] = std::to_string(world);
  env["MASTER_ADDR"] = "127.0.0.1";
  env["MASTER_PORT"] = std::to_string(port);
  env["DSA_JOB_TOKEN"] = token;
  std::vector<std::string> env_strings, argv_strings{probe_path()};
  for (const auto& [k, v] : env)
    env_strings.push_back(k + "=" + v);
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> envp, argv;
  for (auto& s : env_strings)
    envp.push_back(s.data());
  envp.push_back(nullptr);
  for (auto& s : argv_strings)
    argv.push_back(s.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  int rc = ::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE_MESSAGE(rc == 0, "posix_spawn " << argv[0] << ": " << std::strerror(rc));
  pid_t pid = pid_;
  // A blocking waitpid on its own thread, so the test can wait with a bound and no polling.
  status_ = std::async(std::launch::async, [pid] {
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return st;
  });
}

probe_process::~probe_process() {
  if (status_.valid() && status_.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
    ::kill(pid_, SIGKILL);
  if (status_.valid())
    status_.wait();
}

std::optional<int> probe_process::wait_exit(std::chrono::milliseconds bound) {
  if (status_.wait_for(bound) != std::future_status::ready)
    return std::nullopt;
  return status_.get();
}

} // namespace dsa::test
