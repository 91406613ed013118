// ucx_transport: the active-message header, matching by (peer, tag), rendezvous pulls,
// token checks, abort and endpoint errors. Everything below the public methods runs on
// the engine's progress thread.
#include "io/net/ucx_transport.hpp"

#include "core/log.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace dsa::net {

namespace {

constexpr unsigned am_id = 17;                      // our handler's id on the worker
constexpr std::uint32_t am_magic = 0x55415344u;     // "DSAU"
constexpr std::size_t max_head_bytes = 1024;        // the caller's head rides in the AM header
constexpr std::size_t rndv_from_bytes = 64 * 1024;  // payloads this big are pulled by the receiver

enum class am_kind : std::uint8_t { data = 1, abort = 2 };

// The fixed part of every AM header (little-endian at fixed offsets), then the head.
enum : std::size_t {
  at_magic = 0,
  at_kind = 4,
  at_token = 8,
  at_rank = 16,
  at_head_len = 20,
  at_seq = 24, // per (sender, receiver): the receiver delivers in this order
  at_tag = 32,
  am_fixed_bytes = 40
};

template <class T> void put(std::byte* out, std::size_t offset, T value) {
  std::memcpy(out + offset, &value, sizeof(T));
}
template <class T> T get(const void* in, std::size_t offset) {
  T value;
  std::memcpy(&value, static_cast<const std::byte*>(in) + offset, sizeof(T));
  return value;
}

bytes am_header(am_kind kind, std::uint64_t token, int rank, tag_t tag, const bytes& head) {
  bytes h(am_fixed_bytes + head.size());
  put<std::uint32_t>(h.data(), at_magic, am_magic);
  put<std::uint8_t>(h.data(), at_kind, static_cast<std::uint8_t>(kind));
  put<std::uint64_t>(h.data(), at_token, token);
  put<std::int32_t>(h.data(), at_rank, rank);
  put<std::uint32_t>(h.data(), at_head_len, static_cast<std::uint32_t>(head.size()));
  put<std::uint64_t>(h.data(), at_tag, tag);
  if (!head.empty())
    std::memcpy(h.data() + am_fixed_bytes, head.data(), head.size());
  return h;
}

} // namespace

// A message that arrived and is not yet claimed by a receive: its head, and either its
// eager payload or the rendezvous descriptor to pull it with.
struct ucx_transport::arrival {
  tag_t tag = 0;
  bytes head;
  bytes data;
  void* rndv = nullptr;
  std::size_t length = 0; // payload bytes
};

struct ucx_transport::peer_state {
  ucx_transport* self = nullptr;
  int rank = 0;
  ucp_ep_h ep = nullptr;   // peer error handling: control, small payloads, liveness
  ucp_ep_h bulk = nullptr; // no error handling: large payloads (see connect())
  bool failed = false;
  std::uint64_t next_out = 0;               // seq of the next message to this peer
  std::uint64_t next_in = 0;                // seq of the next message from it to deliver
  std::map<std::uint64_t, arrival> early;   // arrivals ahead of next_in
};

struct ucx_transport::send_op {
  int peer = 0;
  tag_t tag = 0;
  bytes header; // the AM header; UCX reads it until completion
  bytes owned;  // the payload when send() gave it away
  const void* payload = nullptr;
  std::size_t payload_bytes = 0;
  std::shared_ptr<completion> done = std::make_shared<completion>();
  bool bulk = false; // went out on the peer's bulk endpoint
};

struct ucx_transport::recv_op {
  int peer = 0;
  tag_t tag = 0;
  bool whole = false; // recv(): the whole message in `result.message`
  std::size_t head_bytes = 0;
  void* payload = nullptr;
  std::size_t payload_bytes = 0;
  bool split = false; // pulled whole, but the right length: copy the payload out at the end
  received_parts result;
  completion done;
};

namespace {

// What a UCX callback needs to find its operation and transport again.
template <class Op> struct op_holder {
  ucx_transport* self;
  std::shared_ptr<Op> op;
};

} // namespace

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
  for (auto& [key, queue] : unclaimed_)
    for (auto& a : queue)
      drop(a);
  unclaimed_.clear();
  for (auto& p : peers_) {
    for (auto& [seq, a] : p->early)
      drop(a);
    p->early.clear();
  }
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

// ---------------------------------------------------------------- progress thread: receives

ucs_status_t ucx_transport::on_am(void* arg, const void* header, std::size_t header_length,
                                  void* data, std::size_t length,
                                  const ucp_am_recv_param_t* param) {
  auto* self = static_cast<ucx_transport*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  // Refusing a rendezvous fails the sender's send; an eager message is simply dropped.
  const ucs_status_t refuse = rndv ? UCS_ERR_REJECTED : UCS_OK;
  if (header_length < am_fixed_bytes || get<std::uint32_t>(header, at_magic) != am_magic) {
    self->refused_.fetch_add(1);
    log_warn("rank {}: refused a {}-byte UCX active message without dsactor's header",
             self->rank_, header_length + length);
    return refuse;
  }
  const int from = get<std::int32_t>(header, at_rank);
  const tag_t tag = get<std::uint64_t>(header, at_tag);
  if (get<std::uint64_t>(header, at_token) != self->token_) {
    self->refused_.fetch_add(1);
    log_warn("rank {}: refused a message claiming to come from rank {} (tag {}, {} bytes): its "
             "job token is not this job's",
             self->rank_, from, tag, length);
    return refuse;
  }
  const auto head_len = get<std::uint32_t>(header, at_head_len);
  if (from < 0 || from >= self->size_ || head_len != header_length - am_fixed_bytes) {
    self->refused_.fetch_add(1);
    log_warn("rank {}: refused a malformed message claiming to come from rank {} (tag {})",
             self->rank_, from, tag);
    return refuse;
  }
  if (self->aborted_.load())
    return rndv ? UCS_ERR_CANCELED : UCS_OK;
  const auto* head = static_cast<const std::byte*>(header) + am_fixed_bytes;
  if (static_cast<am_kind>(get<std::uint8_t>(header, at_kind)) == am_kind::abort) {
    std::string reason(reinterpret_cast<const char*>(head), head_len);
    self->abort(make_error(errc::runtime, "rank {} aborted the group: {}", from, reason));
    return UCS_OK;
  }
  arrival a;
  a.tag = tag;
  a.head.assign(head, head + head_len);
  if (rndv) {
    a.rndv = data;
    a.length = length;
  } else {
    const auto* d = static_cast<const std::byte*>(data);
    a.data.assign(d, d + length);
    a.length = length;
  }
  const auto seq = get<std::uint64_t>(header, at_seq);
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

void ucx_transport::drop(arrival& a) {
  if (a.rndv) // the sender's send then completes (with an error) instead of waiting
    ucp_am_data_release(engine_->worker(), a.rndv);
  a.rndv = nullptr;
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
  for (auto& [key, queue] : unclaimed_)
    for (auto& a : queue)
      drop(a);
  unclaimed_.clear();
  for (auto& p : peers_) {
    for (auto& [seq, a] : p->early)
      drop(a);
    p->early.clear();
  }
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
