// The asynchronous collectives over NCCL; see nccl_collectives.hpp.
#include "io/net/nccl_collectives.hpp"

#include <fmt/format.h>

namespace dsa::net {

nccl_collectives::nccl_collectives(std::unique_ptr<nccl::communicator> comm, nccl::stream_t stream,
                                   std::function<bool()> stream_done, std::chrono::milliseconds deadline,
                                   std::chrono::microseconds poll, nccl::clock_fn clock)
    : comm_(std::move(comm)), stream_(stream), stream_done_(std::move(stream_done)), deadline_(deadline), poll_(poll),
      clock_(std::move(clock)) {
  DSA_CHECK(comm_ != nullptr && stream_done_, "nccl_collectives: a communicator and a completion query");
}

expected<async_collectives::ticket> nccl_collectives::issued(status s) {
  if (!s) {
    failure_ = s.err(); // an operation a rank could not enqueue: its peers' will never complete
    comm_->abort();
    return *failure_;
  }
  return next_++;
}

expected<async_collectives::ticket> nccl_collectives::all_reduce_sum(void* data, dtype type, std::int64_t count) {
  if (failure_) return *failure_;
  nccl::element e;
  switch (type) {
  case dtype::f32: e = nccl::element::f32; break;
  case dtype::f16: e = nccl::element::f16; break;
  case dtype::bf16: e = nccl::element::bf16; break;
  default: // refused here as NCCL would refuse it: a failed operation, so the group breaks
    return issued(make_error(errc::invalid_argument, "NCCL collectives of rank {}: an allreduce of {} elements: f32, "
                             "f16 or bf16 only", comm_->rank(), dtype_name(type)));
  }
  if (count < 0)
    return issued(make_error(errc::invalid_argument, "NCCL collectives of rank {}: an allreduce of {} elements",
                             comm_->rank(), count));
  return issued(comm_->all_reduce_sum(data, static_cast<std::size_t>(count), e, stream_));
}

expected<async_collectives::ticket> nccl_collectives::all_gather(void* out, const void* in, dtype type,
                                                                 std::int64_t count) {
  if (failure_) return *failure_;
  if (count < 0)
    return issued(make_error(errc::invalid_argument, "NCCL collectives of rank {}: an allgather of {} elements",
                             comm_->rank(), count));
  auto n = static_cast<std::size_t>(count);
  nccl::element e = nccl::element::u8;
  switch (type) {
  case dtype::f32: e = nccl::element::f32; break;
  case dtype::f16: e = nccl::element::f16; break;
  case dtype::bf16: e = nccl::element::bf16; break;
  case dtype::i64: e = nccl::element::i64; break;
  default: n *= dtype_size(type); break; // the bytes, unchanged
  }
  return issued(comm_->all_gather(out, in, n, e, stream_));
}

status nccl_collectives::wait(ticket t) {
  if (t == 0 || t >= next_)
    return make_error(errc::invalid_argument, "NCCL collectives of rank {}: wait for ticket {}, but {} were handed out",
                      comm_->rank(), t, next_ - 1);
  if (t <= finished_) return {};
  if (failure_) return *failure_;
  const ticket last = next_ - 1;
  status s = comm_->wait(stream_done_, fmt::format("the collectives up to ticket {}", last), deadline_, poll_, clock_);
  if (!s) {
    failure_ = s.err(); // the communicator was aborted: nothing of the group completes after
    return *failure_;
  }
  finished_ = last;
  return {};
}

} // namespace dsa::net
