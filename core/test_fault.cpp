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
  const auto bad = [&] {
    return std::runtime_error(fmt::format(
        "DSA_TEST_KILL_IN: expected MARKER:PROCESS:PHASE:STEP (PHASE forward, allreduce, commit or swap), got '{}'", all));
  };
  auto specs = split_fault_specs(all, 3);
  if (!specs) throw bad();
  std::vector<kill_in> out;
  for (const auto& f : *specs) {
    kill_in k;
    k.marker = f[0];
    char* end = nullptr;
    k.process = static_cast<int>(std::strtol(f[1].c_str(), &end, 10));
    if (*end) throw bad();
    k.step = std::strtoll(f[3].c_str(), &end, 10);
    if (*end) throw bad();
    bool known = false;
    for (phase p : {phase::forward, phase::allreduce, phase::commit, phase::swap})
      if (f[2] == phase_name(p)) k.where = p, known = true;
    if (!known) throw bad();
    out.push_back(std::move(k));
  }
  return out;
}

std::mutex g_mu;
std::vector<kill_in> g_faults; // this process's, under g_mu
std::atomic<bool> g_armed{false};
std::atomic<std::int64_t> g_step{-1}; // the latest step whose forward began here

} // namespace

std::optional<std::vector<std::vector<std::string>>> split_fault_specs(const std::string& value, std::size_t fields) {
  std::vector<std::vector<std::string>> out;
  for (std::size_t from = 0; from <= value.size();) {
    const auto comma = std::min(value.find(',', from), value.size());
    const std::string s = value.substr(from, comma - from);
    from = comma + 1;
    // The fields from the right: MARKER may hold colons.
    std::vector<std::string> parts(fields + 1);
    std::size_t end = s.size();
    for (std::size_t i = fields; i > 0; --i) {
      const auto colon = end == 0 ? std::string::npos : s.rfind(':', end - 1);
      if (colon == std::string::npos || colon + 1 == end) return std::nullopt;
      parts[i] = s.substr(colon + 1, end - colon - 1);
      end = colon;
    }
    parts[0] = s.substr(0, end);
    if (parts[0].empty()) return std::nullopt;
    out.push_back(std::move(parts));
  }
  return out;
}

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
