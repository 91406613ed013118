// The error enum of the runtime, as a CAF error category ("dsactor").
// An actor that fails quits with make_error(code, actor_name, step, why), so the
// coordinator's down handler can say which actor failed, in which step and why.
#pragma once

#include <cstdint>
#include <string>

#include "actors/protocol/failure_info.hpp"
#include "core/error.hpp"

#include <caf/error.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>

namespace dsa::actors {

enum class runtime_errc : std::uint8_t {
  compute_failed = 1, // a stage or optimizer compute threw
  actor_down,         // an actor terminated abnormally
  watchdog,           // no progress within the watchdog deadline
  protocol,           // a message broke the protocol (wrong edge, out of order)
};

std::string to_string(runtime_errc code);

// Builds the error an actor quits with.
caf::error make_failure(runtime_errc code, const failure_info& info);
// The error an actor quits with when a message broke the protocol (`why` names what).
caf::error protocol_failure(const std::string& actor, std::uint32_t step, const dsa::error& why);
// Reads the context back; false when the error carries no failure_info.
bool read_failure(const caf::error& err, failure_info& out);

} // namespace dsa::actors

CAF_ERROR_CODE_ENUM(dsa::actors::runtime_errc, "dsactor")
