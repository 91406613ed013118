// Request checks and the future form of submit; see submitter.hpp.
#include "io/aio/submitter.hpp"

#include <memory>

namespace dsa::aio {

const char* io_priority_name(io_priority p) {
  switch (p) {
  case io_priority::fetch:
    return "fetch";
  case io_priority::update:
    return "update";
  case io_priority::prefetch:
    return "prefetch";
  case io_priority::write_behind:
    return "write_behind";
  }
  return "?";
}

status check_request(const aio_request& request, std::size_t align) {
  const std::size_t padded = round_up(request.bytes, align);
  if (reinterpret_cast<std::uintptr_t>(request.buffer) % align != 0 ||
      (request.buffer == nullptr && padded > 0))
    return make_error(errc::invalid_argument, "aio {} '{}': buffer {} is not aligned to {} bytes",
                      aio_op_name(request.op), request.path, request.buffer, align);
  if (request.buffer_bytes < padded)
    return make_error(
        errc::invalid_argument,
        "aio {} '{}': buffer of {} bytes is smaller than the {} bytes padded to the alignment {}",
        aio_op_name(request.op), request.path, request.buffer_bytes, padded, align);
  if (request.file_offset % align != 0)
    return make_error(errc::invalid_argument, "aio {} '{}': file offset {} is not a multiple of {}",
                      aio_op_name(request.op), request.path, request.file_offset, align);
  return {};
}

std::future<aio_completion> submit_future(submitter& to, aio_request request,
                                          io_priority priority) {
  auto promise = std::make_shared<std::promise<aio_completion>>();
  auto future = promise->get_future();
  aio_completion early{0, request.op, request.path, request.bytes, false, {}};
  auto id = to.submit(std::move(request), priority,
                      [promise](aio_completion&& c) { promise->set_value(std::move(c)); });
  if (!id) {
    early.result = id.err();
    promise->set_value(std::move(early));
  }
  return future;
}

} // namespace dsa::aio
