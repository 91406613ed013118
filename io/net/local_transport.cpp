// In-process transport: mailboxes guarded by a mutex and a condition variable each.
#include "io/net/local_transport.hpp"

namespace dsa::net {

int local_transport::size() const {
  return group_.size();
}

status local_transport::send(int peer, tag_t tag, bytes message) {
  const std::size_t n = message.size();
  DSA_TRY(group_.deliver(rank_, peer, tag, std::move(message)));
  count_sent(n);
  return {};
}

expected<bytes> local_transport::recv(int peer, tag_t tag) {
  return group_.take(rank_, peer, tag);
}

void local_transport::abort(const error& reason) {
  group_.abort(reason);
}

std::optional<error> local_transport::aborted() const {
  return group_.aborted();
}

local_group::local_group(int size) {
  DSA_CHECK(size >= 1, "local_group needs at least one rank, got {}", size);
  for (int r = 0; r < size; ++r) {
    ranks_.push_back(std::make_unique<local_transport>(*this, r));
    mailboxes_.push_back(std::make_unique<mailbox>());
  }
}

local_transport& local_group::at(int rank) {
  DSA_CHECK(rank >= 0 && rank < size(), "rank {} outside a local group of {}", rank, size());
  return *ranks_[static_cast<std::size_t>(rank)];
}

void local_group::abort(const error& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (!abort_reason_)
      abort_reason_ = reason; // the first reason is the cause; keep it
    aborted_.store(true);
  }
  // Taking each mailbox lock before notifying means a receiver either saw the flag
  // under its lock or is already waiting and gets this notification.
  for (auto& box : mailboxes_) {
    std::lock_guard<std::mutex> lock(box->mutex);
    box->arrived.notify_all();
  }
}

std::optional<error> local_group::aborted() const {
  std::lock_guard<std::mutex> lock(abort_mutex_);
  return abort_reason_;
}

error local_group::abort_error(int rank) const {
  auto reason = aborted();
  return make_error(errc::runtime, "rank {}: local group aborted: {}", rank,
                    reason ? reason->to_string() : std::string("(no reason)"));
}

status local_group::check_peer(int from, int peer, const char* what) const {
  if (peer < 0 || peer >= size())
    return make_error(errc::invalid_argument,
                      "rank {}: {} peer {} outside the group of {} ranks (0..{})", from, what, peer,
                      size(), size() - 1);
  return {};
}

status local_group::deliver(int from, int to, tag_t tag, bytes message) {
  DSA_TRY(check_peer(from, to, "send to"));
  if (aborted_.load())
    return abort_error(from);
  mailbox& box = *mailboxes_[static_cast<std::size_t>(to)];
  {
    std::lock_guard<std::mutex> lock(box.mutex);
    box.queues[{from, tag}].push_back(std::move(message));
  }
  box.arrived.notify_all();
  return {};
}

expected<bytes> local_group::take(int to, int from, tag_t tag) {
  DSA_TRY(check_peer(to, from, "receive from"));
  mailbox& box = *mailboxes_[static_cast<std::size_t>(to)];
  std::unique_lock<std::mutex> lock(box.mutex);
  const std::pair<int, tag_t> key{from, tag};
  for (;;) {
    if (aborted_.load())
      return abort_error(to);
    auto it = box.queues.find(key);
    if (it != box.queues.end()) {
      bytes message = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty())
        box.queues.erase(it); // keeps the map as small as the traffic in flight
      return message;
    }
    box.arrived.wait(lock);
  }
}

} // namespace dsa::net
