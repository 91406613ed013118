// ucx_transport: setup and teardown, the public methods, sends, abort and endpoint
// errors (receives are in ucx_receive.cpp). Everything below the public methods runs on
// the engine's progress thread.
#include "io/net/ucx_transport.hpp"

#include "io/net/ucx_transport_impl.hpp"

#include "core/log.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace dsa::net {

using namespace ucx_detail;

// ---------------------------------------------------------------- setup and teardown

ucx_transport::ucx_transport(int rank, int size, std::uint64_t job_token,
                             std::unique_ptr<ucx_engine> engine)
    : rank_(rank), size_(size), token_(job_token), engine_(std::move(engine)) {
  for (int r = 0; r < size; ++r) {
    auto p = std::make_unique<peer_state>();
    p->self = this;
    p->rank = r;
    peers_.push_back(std::move(p));
  }
}

expected<std::unique_ptr<ucx_transport>> ucx_transport::create(int rank, int size,
                                                                std::uint64_t job_token) {
  if (size < 1 || rank < 0 || rank >= size)
    return make_error(errc::invalid_argument, "ucx_transport: rank {} outside a group of {}", rank,
                      size);
  DSA_ASSIGN_OR_RETURN(auto engine, ucx_engine::start());
  std::unique_ptr<ucx_transport> t(new ucx_transport(rank, size, job_token, std::move(engine)));
  ucs_status_t st = UCS_OK;
  t->engine_->run_sync([&] {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = am_id;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.cb = &ucx_transport::on_am;
    hp.arg = t.get();
    st = ucp_worker_set_am_recv_handler(t->engine_->worker(), &hp);
    t->engine_->set_tick([self = t.get()] { self->check_local_peers(); });
  });
  if (st != UCS_OK)
    return ucx_error(st, fmt::format("rank {}: ucp_worker_set_am_recv_handler", rank));
  return t;
}

status ucx_transport::connect(const std::vector<bytes>& addresses) {
  if (static_cast<int>(addresses.size()) != size_)
    return make_error(errc::invalid_argument, "rank {}: connect got {} addresses for {} ranks",
                      rank_, addresses.size(), size_);
  for (int r = 0; r < size_; ++r)
    if (addresses[static_cast<std::size_t>(r)].empty())
      return make_error(errc::invalid_argument, "rank {}: connect got no address for rank {}",
                        rank_, r);
  std::vector<bytes> ucx_addresses(static_cast<std::size_t>(size_));
  std::vector<process_identity> who(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    auto parts = unwrap_identity(addresses[static_cast<std::size_t>(r)]);
    if (!parts)
      return make_error(errc::protocol, "rank {}: connect: rank {}'s address: {}", rank_, r,
                        parts.err().message);
    who[static_cast<std::size_t>(r)] = std::move(parts->first);
    ucx_addresses[static_cast<std::size_t>(r)] = std::move(parts->second);
  }
  const process_identity me = this_process();
  status result;
  engine_->run_sync([&] {
    if (connected_) {
      result = make_error(errc::invalid_argument, "rank {}: connect called twice", rank_);
      return;
    }
    for (int r = 0; r < size_ && result; ++r) {
      peer_state& p = *peers_[static_cast<std::size_t>(r)];
      const auto* address =
          reinterpret_cast<const ucp_address_t*>(ucx_addresses[static_cast<std::size_t>(r)].data());
      const process_identity& peer = who[static_cast<std::size_t>(r)];
      if (r != rank_ && peer.host_key == me.host_key) {
        result = local_peers_.add(r, peer.pid);
        if (!result)
          break;
      }
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.address = address;
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = &ucx_transport::on_ep_error;
      ep.err_handler.arg = &p;
      ucs_status_t st = ucp_ep_create(engine_->worker(), &ep, &p.ep);
      if (st != UCS_OK) {
        p.ep = nullptr;
        result = ucx_error(st, fmt::format("rank {}: ucp_ep_create to rank {}", rank_, r));
        break;
      }
      if (r == rank_)
        continue;
      // UCX 1.13 has no peer failure detection on cma, the single-copy path between
      // processes of one host, so an endpoint with peer error handling pulls large
      // payloads through the shared-memory FIFO, copy by copy (measured 0.1 GB/s against
      // 4 GB/s). Large payloads therefore take a second endpoint without error
      // handling; the first one still watches the peer, and its failure force-closes
      // this one, which ends whatever is in flight on it.
      ucp_ep_params_t bulk{};
      bulk.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
      bulk.address = address;
      bulk.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      st = ucp_ep_create(engine_->worker(), &bulk, &p.bulk);
      if (st != UCS_OK) {
        p.bulk = nullptr;
        result = ucx_error(st, fmt::format("rank {}: ucp_ep_create (bulk) to rank {}", rank_, r));
      }
    }
    connected_ = true;
    if (!result)
      return;
    // Wire every endpoint up now (a flush completes once the peer has answered), so no
    // endpoint still has its handshake pending when a peer fails later: UCX 1.13 asserts
    // when it discards a TCP endpoint whose handshake request is still queued.
    std::vector<void*> flushing;
    for (auto& p : peers_)
      for (ucp_ep_h ep : {p->ep, p->bulk}) {
        if (!ep)
          continue;
        ucp_request_param_t prm{};
        void* req = ucp_ep_flush_nbx(ep, &prm);
        if (UCS_PTR_IS_ERR(req))
          result = ucx_error(UCS_PTR_STATUS(req),
                             fmt::format("rank {}: connecting to rank {}", rank_, p->rank));
        else if (req)
          flushing.push_back(req);
      }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!flushing.empty()) {
      if (std::chrono::steady_clock::now() > deadline) {
        result = make_error(errc::runtime, "rank {}: connect: {} endpoints not wired up after "
                                           "60 s", rank_, flushing.size());
        break;
      }
      ucp_worker_progress(engine_->worker());
      flushing.erase(std::remove_if(flushing.begin(), flushing.end(),
                                    [&](void* req) {
                                      ucs_status_t st = ucp_request_check_status(req);
                                      if (st == UCS_INPROGRESS)
                                        return false;
                                      if (st != UCS_OK && result)
                                        result = ucx_error(st, fmt::format("rank {}: connect", rank_));
                                      ucp_request_free(req);
                                      return true;
                                    }),
                     flushing.end());
    }
  });
  return result;
}

ucx_transport::~ucx_transport() {
  // On the progress thread: no more peer checks (a peer's exit seen now would abort this
  // transport through engine_, which reset() below nulls before the thread has ended).
  engine_->run_sync([this] {
    engine_->set_tick({});
    close_endpoints();
  });
  {
    // From here abort() is a no-op: reset() below nulls engine_ before the progress
    // thread has ended, and a late endpoint error must not post to it.
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (!abort_reason_) abort_reason_ = make_error(errc::runtime, "rank {}: the transport is closed", rank_);
  }
  engine_.reset(); // joins the progress thread, which destroys the worker
}

namespace {

// Starts closing `ep`: at once (force) or after flushing what is in flight. Returns the
// request to wait for, or null when done (or failed: nothing to wait for).
void* close_endpoint(ucp_ep_h ep, bool force) {
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  prm.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  void* req = ucp_ep_close_nbx(ep, &prm);
  return req && !UCS_PTR_IS_ERR(req) ? req : nullptr;
}

} // namespace

void ucx_transport::close_endpoints() {
  drop_undelivered();
  std::vector<void*> closing;
  for (auto& p : peers_) {
    // A healthy endpoint is flushed, so what is in flight (an abort notice too) gets
    // out; sends the peer will never pull end when it drops them at its abort. A failed
    // endpoint, and a bulk one after an abort, are dropped at once.
    const bool broken = p->failed || torn_down_;
    for (ucp_ep_h* ep : {&p->bulk, &p->ep}) {
      if (!*ep)
        continue;
      void* req = close_endpoint(*ep, ep == &p->bulk ? broken : p->failed);
      *ep = nullptr;
      if (req)
        closing.push_back(req);
    }
  }
  // Peers that vanish make their flush fail rather than hang (peer error handling); the
  // deadline only guards against a peer that is alive but never pulls what it was sent.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!closing.empty() && std::chrono::steady_clock::now() < deadline) {
    ucp_worker_progress(engine_->worker());
    closing.erase(std::remove_if(closing.begin(), closing.end(),
                                 [](void* req) {
                                   if (ucp_request_check_status(req) == UCS_INPROGRESS)
                                     return false;
                                   ucp_request_free(req);
                                   return true;
                                 }),
                  closing.end());
  }
  connected_ = false;
}

// ---------------------------------------------------------------- public, any thread

status ucx_transport::check_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= size_)
    return make_error(errc::invalid_argument,
                      "rank {}: {} peer {} outside the group of {} ranks (0..{})", rank_, what,
                      peer, size_, size_ - 1);
  return {};
}

std::optional<error> ucx_transport::aborted() const {
  std::lock_guard<std::mutex> lock(abort_mutex_);
  return abort_reason_;
}

error ucx_transport::abort_error() const {
  auto reason = aborted();
  return make_error(errc::runtime, "rank {}: UCX transport aborted: {}", rank_,
                    reason ? reason->message : std::string("(no reason)"));
}

void ucx_transport::abort(const error& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (abort_reason_)
      return; // the first reason is the cause
    abort_reason_ = reason;
    aborted_.store(true);
  }
  log_debug("rank {}: UCX transport aborting: {}", rank_, reason.to_string());
  engine_->post([this] { abort_locally(); });
}

status ucx_transport::send(int peer, tag_t tag, bytes message) {
  DSA_TRY(check_peer(peer, "send to"));
  const void* payload = message.data();
  const std::size_t n = message.size();
  DSA_TRY(post_send(peer, tag, bytes{}, std::move(message), payload, n));
  return {};
}

expected<send_ticket> ucx_transport::send_parts(int peer, tag_t tag, bytes head,
                                                const void* payload, std::size_t payload_bytes) {
  DSA_TRY(check_peer(peer, "send to"));
  return post_send(peer, tag, std::move(head), bytes{}, payload, payload_bytes);
}

expected<send_ticket> ucx_transport::post_send(int peer, tag_t tag, bytes head, bytes owned,
                                               const void* payload, std::size_t payload_bytes) {
  if (head.size() > max_head_bytes)
    return make_error(errc::invalid_argument, "rank {} -> rank {}, tag {}: a {}-byte head (at most {})",
                      rank_, peer, tag, head.size(), max_head_bytes);
  if (aborted_.load())
    return abort_error();
  auto op = std::make_shared<send_op>();
  op->peer = peer;
  op->tag = tag;
  op->header = am_header(am_kind::data, token_, rank_, tag, head);
  op->owned = std::move(owned); // moving a vector keeps its data pointer: `payload` stays valid
  op->payload = payload;
  op->payload_bytes = payload_bytes;
  count_sent(head.size() + payload_bytes);
  send_ticket ticket(op->done);
  engine_->post([this, op] { start_send(op); });
  return ticket;
}

expected<bytes> ucx_transport::recv(int peer, tag_t tag) {
  DSA_TRY(check_peer(peer, "receive from"));
  DSA_ASSIGN_OR_RETURN(received_parts got, post_recv(peer, tag, 0, nullptr, 0));
  return std::move(got.message);
}

expected<received_parts> ucx_transport::recv_parts(int peer, tag_t tag, std::size_t head_bytes,
                                                   void* payload, std::size_t payload_bytes) {
  DSA_TRY(check_peer(peer, "receive from"));
  auto op = post_recv(peer, tag, head_bytes, payload, payload_bytes);
  return op;
}

expected<received_parts> ucx_transport::post_recv(int peer, tag_t tag, std::size_t head_bytes,
                                                  void* payload, std::size_t payload_bytes) {
  if (aborted_.load())
    return abort_error();
  auto op = std::make_shared<recv_op>();
  op->peer = peer;
  op->tag = tag;
  op->whole = payload == nullptr && payload_bytes == 0 && head_bytes == 0;
  op->head_bytes = head_bytes;
  op->payload = payload;
  op->payload_bytes = payload_bytes;
  engine_->post([this, op] { start_recv(op); });
  DSA_TRY(op->done.wait());
  return std::move(op->result);
}

// ---------------------------------------------------------------- progress thread: sends

void ucx_transport::start_send(const std::shared_ptr<send_op>& op) {
  peer_state& p = *peers_[static_cast<std::size_t>(op->peer)];
  // Sends posted before abort() still go out (the queue runs in order); later ones fail.
  if (torn_down_) {
    op->done->finish(abort_error());
    return;
  }
  if (!p.ep) {
    op->done->finish(make_error(errc::invalid_argument,
                                "rank {} -> rank {}, tag {}: send before connect()", rank_,
                                op->peer, op->tag));
    return;
  }
  put<std::uint64_t>(op->header.data(), at_seq, p.next_out++);
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_FLAGS;
  prm.flags = op->payload_bytes >= rndv_from_bytes ? UCP_AM_SEND_FLAG_RNDV : 0;
  auto* holder = new op_holder<send_op>{this, op};
  prm.user_data = holder;
  prm.cb.send = [](void* request, ucs_status_t st, void* user_data) {
    auto* h = static_cast<op_holder<send_op>*>(user_data);
    ucx_transport* self = h->self;
    const send_op& o = *h->op;
    if (st == UCS_OK) {
      o.done->finish({});
    } else {
      error err = st == UCS_ERR_REJECTED
                      ? make_error(errc::protocol,
                                   "rank {} -> rank {}, tag {}: refused by the receiver (a job "
                                   "token other than this job's?)",
                                   self->rank_, o.peer, o.tag)
                      : make_error(errc::runtime,
                                   "rank {} lost (UCX send from rank {}, tag {}: {})", o.peer,
                                   self->rank_, o.tag, ucs_status_string(st));
      o.done->finish(err);
      self->abort(err); // the message is lost: whoever waits for it must not hang
    }
    self->sending_.erase(h->op.get());
    ucp_request_free(request);
    delete h;
  };
  const bool large = op->payload_bytes >= rndv_from_bytes;
  op->bulk = large && p.bulk;
  ucp_ep_h ep = op->bulk ? p.bulk : p.ep;
  void* req = ucp_am_send_nbx(ep, am_id, op->header.data(), op->header.size(), op->payload,
                              op->payload_bytes, &prm);
  if (req == nullptr) { // done at once: no callback comes
    op->done->finish({});
    delete holder;
  } else if (UCS_PTR_IS_ERR(req)) {
    error err = make_error(errc::runtime, "rank {} lost (UCX send from rank {}, tag {}: {})",
                           op->peer, rank_, op->tag, ucs_status_string(UCS_PTR_STATUS(req)));
    op->done->finish(err);
    delete holder;
    abort(err);
  } else {
    sending_.emplace(op.get(), op);
  }
}

void ucx_transport::send_abort_notices(const std::string& reason) {
  bytes head(reinterpret_cast<const std::byte*>(reason.data()),
             reinterpret_cast<const std::byte*>(reason.data()) +
                 std::min(reason.size(), max_head_bytes));
  for (auto& p : peers_) {
    if (!p->ep || p->failed || p->rank == rank_)
      continue;
    auto op = std::make_shared<send_op>();
    op->peer = p->rank;
    op->header = am_header(am_kind::abort, token_, rank_, 0, head);
    put<std::uint64_t>(op->header.data(), at_seq, p->next_out++);
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    auto* holder = new op_holder<send_op>{this, op};
    prm.user_data = holder;
    prm.cb.send = [](void* request, ucs_status_t, void* user_data) {
      ucp_request_free(request); // best effort: the peer may be the one that failed
      delete static_cast<op_holder<send_op>*>(user_data);
    };
    void* req = ucp_am_send_nbx(p->ep, am_id, op->header.data(), op->header.size(), nullptr, 0,
                                &prm);
    if (req == nullptr || UCS_PTR_IS_ERR(req))
      delete holder;
  }
}

// ---------------------------------------------------------------- progress thread: failure

void ucx_transport::on_ep_error(void* arg, ucp_ep_h, ucs_status_t st) {
  auto* p = static_cast<peer_state*>(arg);
  p->failed = true;
  p->self->abort(make_error(errc::runtime, "rank {} lost (UCX endpoint error on rank {}: {})",
                            p->rank, p->self->rank_, ucs_status_string(st)));
}

void ucx_transport::check_local_peers() {
  for (int r : local_peers_.exited()) {
    peer_state& p = *peers_[static_cast<std::size_t>(r)];
    p.failed = true;
    abort(make_error(errc::runtime, "rank {} lost (its process exited; seen by rank {})", r,
                     rank_));
  }
}

void ucx_transport::abort_locally() {
  torn_down_ = true;
  const error err = abort_error();
  for (auto& [key, ops] : waiting_)
    for (auto& op : ops)
      op->done.finish(err);
  waiting_.clear();
  drop_undelivered();
  if (connected_) {
    auto reason = aborted();
    send_abort_notices(reason ? reason->message : std::string("(no reason)"));
    // Bulk endpoints cannot notice a dead peer: closing them ends their sends (with
    // UCS_ERR_CANCELED), so no collective waits forever for a pull that never comes.
    for (auto& p : peers_)
      if (p->bulk) {
        void* req = close_endpoint(p->bulk, true);
        p->bulk = nullptr;
        if (req)
          ucp_request_free(req); // a forced close needs nothing more from us
      }
    // UCX 1.13 does not always cancel a rendezvous send when its endpoint is closed by
    // force, so its ticket is ended here: after the abort no one pulls it any more, and
    // this process no longer reads the payload (a peer still pulling reads its own copy
    // of our mapping, or fails). Sends to a lost peer end the same way.
    for (auto& [raw, op] : sending_)
      if (op->bulk || peers_[static_cast<std::size_t>(op->peer)]->failed)
        op->done->finish(err);
  }
}

} // namespace dsa::net
