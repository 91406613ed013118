// Argument checks shared by the collectives.
#include "io/net/call_checks.hpp"

namespace dsa::net {

status check_call(const wire_header& call, int rank) {
  if (call.count < 0)
    return make_error(errc::invalid_argument, "rank {}, call #{} {}: count {} is negative", rank,
                      call.seq, op_kind_name(call.kind), call.count);
  if (dtype_size(call.type) == 0)
    return make_error(errc::invalid_argument, "rank {}, call #{} {}: unknown dtype (enum value {})",
                      rank, call.seq, op_kind_name(call.kind), static_cast<unsigned>(call.type));
  return {};
}

status check_pointer(const wire_header& call, int rank, const char* what, const void* p,
                     std::int64_t elements) {
  if (p == nullptr && elements > 0)
    return make_error(errc::invalid_argument, "rank {}, call #{} {}: {} is null for {} elements",
                      rank, call.seq, op_kind_name(call.kind), what, elements);
  return {};
}

status check_reducible(const wire_header& call, int rank) {
  if (!dtype_is_float(call.type))
    return make_error(errc::invalid_argument,
                      "rank {}, call #{} {}: dtype {} cannot be summed (f32, f16 or bf16)", rank,
                      call.seq, op_kind_name(call.kind), dtype_name(call.type));
  return {};
}

} // namespace dsa::net
