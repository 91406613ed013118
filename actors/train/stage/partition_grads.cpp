// ZeRO-3's gradient partition; see partition_grads.hpp.
#include "actors/train/stage/partition_grads.hpp"

#include "actors/data_parallel.hpp"
#include "actors/train/config/precision.hpp"
#include "core/file_backed.hpp"

#include <fmt/format.h>

#include <sys/mman.h>

#include <algorithm>
#include <new>
#include <stdexcept>

namespace dsa::train {

namespace {
// (n) f32 zeros in an anonymous mapping: no page is resident until written (the stage's
// load of the first version zeroes it, after the stage's whole initial weights are gone;
// malloc'ed memory may be touched at once, e.g. under MALLOC_PERTURB_).
tensor untouched_zeros(std::int64_t n) {
  const std::size_t bytes = std::max<std::size_t>(static_cast<std::size_t>(n) * sizeof(float), 1);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  auto s = storage::wrap(p, bytes, device::cpu(), [bytes](void* q) { ::munmap(q, bytes); });
  return tensor::from_storage(std::move(s), 0, {n}, dtype::f32);
}
} // namespace

partition_grads::partition_grads(optim::flat_layout layout, std::uint32_t rank, dtype working,
                                 std::shared_ptr<net::communicator> comm, std::int64_t pending_elements,
                                 net::comms_logger* logger, std::string caller, tensor accumulator)
    : layout_(std::move(layout)), rank_(rank), working_(working), comm_(std::move(comm)),
      pending_limit_(pending_elements), logger_(logger), caller_(std::move(caller)) {
  DSA_CHECK(comm_ && comm_->size() == static_cast<int>(layout_.ranks()) && comm_->rank() == static_cast<int>(rank),
            "gradient partition: rank {} of {} needs that rank's communicator", rank, layout_.ranks());
  if (accumulator.defined()) {
    DSA_CHECK(accumulator.type() == dtype::f32 && accumulator.is_contiguous() &&
                  accumulator.numel() == layout_.partition_numel(),
              "gradient partition: the accumulator is {}, expected f32[{}]", accumulator.describe(),
              layout_.partition_numel());
    partition_ = std::move(accumulator);
    in_file_ = is_file_backed(partition_);
  } else {
    partition_ = untouched_zeros(layout_.partition_numel());
  }
  pieces_.resize(layout_.tensors().size());
  for (const auto& p : layout_.pieces(layout_.partition(rank_))) pieces_[p.tensor] = p;
  thread_ = std::thread([this] { run_thread(); });
}

partition_grads::~partition_grads() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

tensor partition_grads::piece_of(std::size_t t) const {
  const optim::flat_piece& p = pieces_.at(t);
  const std::int64_t at = p.count > 0 ? p.flat_offset - layout_.partition(rank_).lo : 0;
  return partition_.slice_rows(at, at + p.count);
}

void partition_grads::allow(std::uint32_t step) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    allowed_ = std::max<std::int64_t>(allowed_, step);
  }
  cv_.notify_all();
}

void partition_grads::submit(std::size_t t, tensor grad, std::uint32_t step) {
  DSA_CHECK(t < pieces_.size() && grad.defined() && grad.type() == dtype::f32 && grad.is_contiguous() &&
                grad.numel() == layout_.tensors()[t].numel,
            "gradient partition: gradient {} is {}", t, grad.defined() ? grad.describe() : "undefined");
  std::unique_lock<std::mutex> lk(mu_);
  // Back-pressure: the backward waits while too much is queued (but never for an empty
  // queue), and until the step is allowed.
  cv_.wait(lk, [&] {
    return cancelled_ || failed_ ||
           (allowed_ >= static_cast<std::int64_t>(step) && (pending_ == 0 || pending_ + grad.numel() <= pending_limit_));
  });
  if (failed_) throw std::runtime_error("ZeRO-3 gradient reduction failed: " + failed_->message);
  if (cancelled_) throw std::runtime_error("ZeRO-3 gradient reduction: the run is ending");
  pending_ += grad.numel();
  queue_.emplace_back(t, std::move(grad));
  cv_.notify_all();
}

void partition_grads::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return cancelled_ || failed_ || pending_ == 0; });
  if (failed_) throw std::runtime_error("ZeRO-3 gradient reduction failed: " + failed_->message);
  if (pending_ != 0) throw std::runtime_error("ZeRO-3 gradient reduction: the run is ending");
}

void partition_grads::reset() {
  std::lock_guard<std::mutex> lk(mu_);
  DSA_CHECK(pending_ == 0, "gradient partition: reset with {} elements still being summed", pending_);
  zero_file_backed(partition_); // in a file: its blocks zeroed, no page written from here
}

void partition_grads::cancel() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    cancelled_ = true;
  }
  cv_.notify_all();
}

void partition_grads::run_thread() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || (!queue_.empty() && !failed_); });
    if (stop_) return;
    auto [t, grad] = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    const std::int64_t n = grad.numel();
    status s = reduce(t, grad);
    grad = tensor{}; // freed before the next is taken
    lk.lock();
    if (!s) failed_ = s.err();
    pending_ -= n;
    cv_.notify_all();
  }
}

status partition_grads::reduce(std::size_t t, tensor& grad) {
  round_in_place(grad, working_);
  if (comm_->size() > 1)
    if (auto r = actors::log_collective(logger_, "all_reduce", grad.numel() * 4, caller_,
                                        [&] { return comm_->allreduce_sum(grad.raw_data(), dtype::f32, grad.numel()); });
        !r)
      return make_error(r.err().code, "summing the gradient of {} over the ranks: {}", layout_.tensors()[t].name,
                        r.err().message);
  const optim::flat_piece& p = pieces_[t];
  if (p.count == 0) return {};
  float* acc = partition_.data<float>() + (p.flat_offset - layout_.partition(rank_).lo);
  const float* g = grad.data<float>() + p.tensor_offset;
  if (!in_file_) {
    for (std::int64_t i = 0; i < p.count; ++i) acc[i] += g[i];
    return {};
  }
  // In a file: a window at a time, each written back and dropped before the next.
  const std::int64_t window = file_backed_window_bytes() / static_cast<std::int64_t>(sizeof(float));
  for (std::int64_t lo = 0; lo < p.count; lo += window) {
    const std::int64_t hi = std::min(p.count, lo + window);
    for (std::int64_t i = lo; i < hi; ++i) acc[i] += g[i];
    if (auto s = try_page_out(acc + lo, static_cast<std::size_t>(hi - lo) * sizeof(float)); !s)
      return make_error(errc::io, "the gradient partition of {}: {}", layout_.tensors()[t].name, s.err().message);
  }
  return {};
}

} // namespace dsa::train
