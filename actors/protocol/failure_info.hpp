// The failure context an actor's error carries (errors.hpp builds and reads it): which
// actor, which step, why. Free of CAF, so the run's result (run.hpp) can hold it without
// every file that starts a run compiling CAF's headers.
#pragma once

#include <cstdint>
#include <string>

namespace dsa::actors {

struct failure_info {
  std::string actor;
  std::uint32_t step = 0;
  std::string why;
};

} // namespace dsa::actors
