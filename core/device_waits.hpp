// The rule that no actor waits on a device, made checkable. The actor runtime marks the
// threads its scheduler runs actors on (actors/runtime_threads.hpp); every place that
// blocks the host on a device (a stream or event synchronize, a copy the host must read)
// calls device_wait first. A wait on a marked thread throws std::logic_error naming the
// site: completions there must come back as messages. Each wait is counted, so a test can
// show that waits happened and that none was on a runtime thread.
#pragma once

#include <cstdint>

namespace dsa {

// Marks (or unmarks) the calling thread as one of the actor runtime's scheduler threads.
void set_runtime_thread(bool marked);
bool is_runtime_thread();

// Called before a host wait on a device; `site` names it ("cudaStreamSynchronize in ...").
// Throws std::logic_error on a runtime thread (the wait is counted first).
void device_wait(const char* site);

struct device_wait_counts {
  std::int64_t total = 0;      // every device_wait call of the process
  std::int64_t on_runtime = 0; // those on a runtime thread (each one a refused wait)
};
device_wait_counts device_waits();

} // namespace dsa
