// ucx_transport's receiving side, on the progress thread: the active-message handler
// (token and header checks), delivery in sequence order, matching by (peer, tag), and
// rendezvous pulls into the buffer a receive names.
#include "io/net/ucx_transport_impl.hpp"

#include "core/log.hpp"

#include <algorithm>

namespace dsa::net {

using namespace ucx_detail;

// ---------------------------------------------------------------- progress thread: receives

ucs_status_t ucx_transport::on_am(void* arg, const void* header, std::size_t header_length,
                                  void* data, std::size_t length,
                                  const ucp_am_recv_param_t* param) {
  auto* self = static_cast<ucx_transport*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  // Refusing a rendezvous fails the sender's send; an eager message is simply dropped.
  const ucs_status_t refuse = rndv ? UCS_ERR_REJECTED : UCS_OK;
  auto fields = parse_am_header(header, header_length, self->token_, self->rank_, self->size_);
  if (!fields) {
    self->refused_.fetch_add(1);
    log_warn("{} ({} payload bytes)", fields.err().message, length);
    return refuse;
  }
  if (self->aborted_.load())
    return rndv ? UCS_ERR_CANCELED : UCS_OK;
  const am_fields& f = *fields;
  if (f.kind == am_kind::abort) {
    std::string reason(reinterpret_cast<const char*>(f.head), f.head_bytes);
    self->abort(make_error(errc::runtime, "rank {} aborted the group: {}", f.from, reason));
    return UCS_OK;
  }
  arrival a;
  a.tag = f.tag;
  a.head.assign(f.head, f.head + f.head_bytes);
  if (rndv) {
    a.rndv = data;
    a.length = length;
  } else {
    const auto* d = static_cast<const std::byte*>(data);
    a.data.assign(d, d + length);
    a.length = length;
  }
  const int from = f.from;
  const std::uint64_t seq = f.seq;
  // Matching may start a pull, which a UCX callback must not do: after progress returns.
  self->engine_->defer([self, from, seq, a = std::move(a)]() mutable {
    self->arrived(from, seq, std::move(a));
  });
  return rndv ? UCS_INPROGRESS : UCS_OK;
}

void ucx_transport::arrived(int peer, std::uint64_t seq, arrival a) {
  peer_state& p = *peers_[static_cast<std::size_t>(peer)];
  if (aborted_.load()) {
    drop(a);
    return;
  }
  if (seq != p.next_in) { // UCX may overtake; a peer's messages are delivered in send order
    p.early.emplace(seq, std::move(a));
    return;
  }
  deliver(peer, std::move(a));
  ++p.next_in;
  for (auto it = p.early.find(p.next_in); it != p.early.end(); it = p.early.find(p.next_in)) {
    arrival next = std::move(it->second);
    p.early.erase(it);
    deliver(peer, std::move(next));
    ++p.next_in;
  }
}

void ucx_transport::deliver(int peer, arrival a) {
  const std::pair<int, tag_t> key{peer, a.tag};
  auto it = waiting_.find(key);
  if (it == waiting_.end()) {
    unclaimed_[key].push_back(std::move(a));
    return;
  }
  auto op = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty())
    waiting_.erase(it);
  complete_recv(op, std::move(a));
}

void ucx_transport::start_recv(const std::shared_ptr<recv_op>& op) {
  if (aborted_.load()) {
    op->done.finish(abort_error());
    return;
  }
  const std::pair<int, tag_t> key{op->peer, op->tag};
  auto it = unclaimed_.find(key);
  if (it == unclaimed_.end()) {
    waiting_[key].push_back(op);
    return;
  }
  arrival a = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty())
    unclaimed_.erase(it); // keeps the map as small as the traffic in flight
  complete_recv(op, std::move(a));
}

namespace {

// The end of a receive: a message pulled whole that has the asked-for length is split.
void finish_recv(ucx_transport::recv_op& op, status outcome);

} // namespace

void ucx_transport::complete_recv(const std::shared_ptr<recv_op>& op, arrival a) {
  const std::size_t total = a.head.size() + a.length;
  const bool direct =
      !op->whole && a.head.size() == op->head_bytes && a.length == op->payload_bytes;
  std::byte* dst;
  if (direct) {
    op->result.message = std::move(a.head);
    op->result.placed = true;
    dst = static_cast<std::byte*>(op->payload);
  } else {
    const std::size_t head_size = a.head.size();
    op->result.message = std::move(a.head);
    op->result.message.resize(total);
    dst = op->result.message.data() + head_size;
    op->split = !op->whole && total == op->head_bytes + op->payload_bytes;
  }
  if (!a.rndv) {
    if (a.length > 0)
      std::memcpy(dst, a.data.data(), a.length);
    finish_recv(*op, {});
    return;
  }
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  auto* holder = new op_holder<recv_op>{this, op};
  prm.user_data = holder;
  prm.cb.recv_am = [](void* request, ucs_status_t st, std::size_t, void* user_data) {
    auto* h = static_cast<op_holder<recv_op>*>(user_data);
    if (st == UCS_OK) {
      finish_recv(*h->op, {});
    } else {
      error err = make_error(errc::runtime,
                             "rank {} lost (UCX rendezvous pull by rank {}, tag {}: {})",
                             h->op->peer, h->self->rank(), h->op->tag, ucs_status_string(st));
      finish_recv(*h->op, err);
      h->self->abort(err);
    }
    ucp_request_free(request);
    delete h;
  };
  void* req = ucp_am_recv_data_nbx(engine_->worker(), a.rndv, dst, a.length, &prm);
  if (req == nullptr) {
    finish_recv(*op, {});
    delete holder;
  } else if (UCS_PTR_IS_ERR(req)) {
    error err = make_error(errc::runtime,
                           "rank {} lost (UCX rendezvous pull by rank {}, tag {}: {})", op->peer,
                           rank_, op->tag, ucs_status_string(UCS_PTR_STATUS(req)));
    finish_recv(*op, err);
    delete holder;
    abort(err);
  }
}

namespace {

void finish_recv(ucx_transport::recv_op& op, status outcome) {
  if (outcome && op.split) {
    if (op.payload_bytes > 0)
      std::memcpy(op.payload, op.result.message.data() + op.head_bytes, op.payload_bytes);
    op.result.message.resize(op.head_bytes);
    op.result.placed = true;
  }
  op.done.finish(std::move(outcome));
}

} // namespace

void ucx_transport::drop_undelivered() {
  for (auto& [key, queue] : unclaimed_)
    for (auto& a : queue)
      drop(a);
  unclaimed_.clear();
  for (auto& p : peers_) {
    for (auto& [seq, a] : p->early)
      drop(a);
    p->early.clear();
  }
}

void ucx_transport::drop(arrival& a) {
  if (a.rndv) // the sender's send then completes (with an error) instead of waiting
    ucp_am_data_release(engine_->worker(), a.rndv);
  a.rndv = nullptr;
}

} // namespace dsa::net
