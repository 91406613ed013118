// The host-memory plan's measures: /proc/self/status figures, and the end-of-run line that
// sets the plan against them; see memory_plan.hpp.
#include "actors/train/memory/memory_plan.hpp"

#include "core/log.hpp"
#include "core/memory_stats.hpp"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

namespace dsa::train {

std::int64_t proc_status_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  const std::string prefix = std::string(field) + ":";
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) {
      std::istringstream values(line.substr(prefix.size()));
      std::int64_t kib = 0;
      values >> kib;
      return kib * 1024;
    }
  return 0;
}

void log_memory_report(const run_config& rc, const host_memory_plan& plan) {
  const std::int64_t hwm = proc_status_bytes("VmHWM");
  if (rc.host_memory > 0 && hwm > rc.host_memory)
    log_warn("host memory: the measured peak resident memory (VmHWM) {} exceeded limits.host_memory {}: the plan "
             "({}) missed something; please report it",
             format_bytes(hwm), format_bytes(rc.host_memory), format_bytes(plan.peak()));
  const memory_usage tensors = memory_usage_of(device::cpu());
  log_info("host memory: planned peak {}{} (the final evaluation's {}), measured peak resident (VmHWM) {}, tensor "
           "peak {}",
           format_bytes(plan.peak()),
           rc.host_memory > 0 ? fmt::format(" within limits.host_memory {}", format_bytes(rc.host_memory)) : "",
           format_bytes(plan.evaluation_peak()), format_bytes(hwm), format_bytes(tensors.peak_bytes));
}

} // namespace dsa::train
