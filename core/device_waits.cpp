// See device_waits.hpp.
#include "core/device_waits.hpp"

#include <fmt/format.h>

#include <atomic>
#include <stdexcept>

namespace dsa {
namespace {
thread_local bool runtime_thread = false;
std::atomic<std::int64_t> total_waits{0}, runtime_waits{0};
} // namespace

void set_runtime_thread(bool marked) { runtime_thread = marked; }

bool is_runtime_thread() { return runtime_thread; }

void device_wait(const char* site) {
  total_waits.fetch_add(1, std::memory_order_relaxed);
  if (!runtime_thread) return;
  runtime_waits.fetch_add(1, std::memory_order_relaxed);
  throw std::logic_error(fmt::format("{}: a host wait on a device on an actor runtime thread (the device's "
                                     "completion must come back as a message)",
                                     site));
}

device_wait_counts device_waits() {
  return {total_waits.load(std::memory_order_relaxed), runtime_waits.load(std::memory_order_relaxed)};
}

} // namespace dsa
