// Argument checks shared by the collectives. Each error names the rank, the call (its
// sequence number and kind) and the argument.
#pragma once

#include "io/net/wire.hpp"

#include <cstdint>

namespace dsa::net {

// call.count >= 0 and call.type a known dtype.
status check_call(const wire_header& call, int rank);
// p may be null only when it holds no elements.
status check_pointer(const wire_header& call, int rank, const char* what, const void* p,
                     std::int64_t elements);
// call.type is f32, f16 or bf16.
status check_reducible(const wire_header& call, int rank);

} // namespace dsa::net
