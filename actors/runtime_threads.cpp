// See runtime_threads.hpp.
#include "actors/runtime_threads.hpp"

#include "core/device_waits.hpp"

#include <caf/thread_hook.hpp>

namespace dsa::actors {
namespace {

class runtime_thread_hook final : public caf::thread_hook {
public:
  void init(caf::actor_system&) override {}
  void thread_started() override { set_runtime_thread(true); }
  void thread_terminates() override { set_runtime_thread(false); }
};

} // namespace

void mark_runtime_threads(caf::actor_system_config& cfg) { cfg.add_thread_hook<runtime_thread_hook>(); }

} // namespace dsa::actors
