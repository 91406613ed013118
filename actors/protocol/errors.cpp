// Rendering and packing of runtime errors.
#include "actors/protocol/errors.hpp"

#include <caf/message.hpp>

namespace dsa::actors {

std::string to_string(runtime_errc code) {
  switch (code) {
    case runtime_errc::compute_failed: return "compute_failed";
    case runtime_errc::actor_down: return "actor_down";
    case runtime_errc::watchdog: return "watchdog";
    case runtime_errc::protocol: return "protocol";
  }
  return "unknown";
}

caf::error make_failure(runtime_errc code, const failure_info& info) {
  return caf::make_error(code, info.actor, info.step, info.why);
}

caf::error protocol_failure(const std::string& actor, std::uint32_t step, const dsa::error& why) {
  return make_failure(runtime_errc::protocol, {actor, step, why.message});
}

bool read_failure(const caf::error& err, failure_info& out) {
  const auto& ctx = err.context();
  if (!ctx.match_elements<std::string, std::uint32_t, std::string>()) return false;
  out.actor = ctx.get_as<std::string>(0);
  out.step = ctx.get_as<std::uint32_t>(1);
  out.why = ctx.get_as<std::string>(2);
  return true;
}

} // namespace dsa::actors
