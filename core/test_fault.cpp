// Test-only faults aimed at one phase; see test_fault.hpp.
#include "core/test_fault.hpp"

#include "core/log.hpp"

#include <fmt/format.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace dsa::test_fault {

namespace {

struct kill_in {
  std::string marker;
  int process = -1;
  phase where = phase::forward;
  std::int64_t step = 0;
};

const char* phase_name(phase p) {
  switch (p) {
    case phase::forward: return "forward";
    case phase::allreduce: return "allreduce";
    case phase::commit: return "commit";
    case phase::swap: return "swap";
  }
  return "?";
}

std::vector<kill_in> parse(const std::string& all) {
  std::vector<kill_in> out;
  for (std::size_t from = 0; from <= all.size();) {
    const auto comma = std::min(all.find(',', from), all.size());
    const std::string s = all.substr(from, comma - from);
    from = comma + 1;
    // MARKER may hold colons (a path): the last three fields are PROCESS, PHASE, STEP.
    const auto c3 = s.rfind(':');
    const auto c2 = c3 == std::string::npos || c3 == 0 ? std::string::npos : s.rfind(':', c3 - 1);
    const auto c1 = c2 == std::string::npos || c2 == 0 ? std::string::npos : s.rfind(':', c2 - 1);
    const auto bad = [&] {
      return std::runtime_error(fmt::format(
          "DSA_TEST_KILL_IN: expected MARKER:PROCESS:PHASE:STEP (PHASE forward, allreduce, commit or swap), got '{}'", s));
    };
    if (c1 == std::string::npos) throw bad();
    kill_in k;
    k.marker = s.substr(0, c1);
    const std::string process = s.substr(c1 + 1, c2 - c1 - 1), name = s.substr(c2 + 1, c3 - c2 - 1),
                      step = s.substr(c3 + 1);
    char* end = nullptr;
    k.process = static_cast<int>(std::strtol(process.c_str(), &end, 10));
    if (process.empty() || *end) throw bad();
    k.step = std::strtoll(step.c_str(), &end, 10);
    if (step.empty() || *end) throw bad();
    bool known = false;
    for (phase p : {phase::forward, phase::allreduce, phase::commit, phase::swap})
      if (name == phase_name(p)) k.where = p, known = true;
    if (!known || k.marker.empty()) throw bad();
    out.push_back(std::move(k));
  }
  return out;
}

std::mutex g_mu;
std::vector<kill_in> g_faults; // this process's, under g_mu
std::atomic<bool> g_armed{false};
std::atomic<std::int64_t> g_step{-1}; // the latest step whose forward began here

} // namespace

bool claim(const std::string& marker) {
  const int fd = ::open(marker.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

void set_process(int process) {
  const char* spec = std::getenv("DSA_TEST_KILL_IN");
  if (!spec || !*spec) return;
  std::vector<kill_in> mine;
  for (auto& k : parse(spec))
    if (k.process == process) mine.push_back(std::move(k));
  std::lock_guard lock(g_mu);
  g_faults = std::move(mine);
  g_armed.store(!g_faults.empty());
}

void at(phase p, std::int64_t step) {
  if (!g_armed.load(std::memory_order_relaxed)) return;
  if (p == phase::forward && step >= 0) {
    std::int64_t seen = g_step.load();
    while (step > seen && !g_step.compare_exchange_weak(seen, step)) {
    }
  }
  const std::int64_t now = p == phase::commit ? step : g_step.load();
  std::lock_guard lock(g_mu);
  for (auto it = g_faults.begin(); it != g_faults.end();) {
    if (it->where != p || now < it->step) {
      ++it;
      continue;
    }
    if (claim(it->marker)) {
      log_warn("DSA_TEST_KILL_IN: killing this process in {} at step {}", phase_name(p), now);
      ::raise(SIGKILL);
    }
    it = g_faults.erase(it); // fired in an earlier run of the job
  }
}

} // namespace dsa::test_fault
