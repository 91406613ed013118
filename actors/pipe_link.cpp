// The pipeline's messages between processes; see pipe_link.hpp.
#include "actors/pipe_link.hpp"

#include "io/net/flight_recorder.hpp"

#include "core/byte_codec.hpp"
#include "core/log.hpp"

#include <fmt/format.h>


namespace dsa::actors {

namespace {

enum class link_kind : std::uint8_t { produced = 0, released = 1, grad_partial = 2, end = 3 };

constexpr std::uint8_t max_dims = 8;

} // namespace

pipe_link::pipe_link(net::transport& world, std::shared_ptr<slot_table> slots, std::vector<int> peers)
    : world_(world), slots_(std::move(slots)), peers_(std::move(peers)) {}

pipe_link::~pipe_link() { finish(); }

void pipe_link::start(deliver_fn deliver) {
  std::lock_guard<std::mutex> lock(send_mutex_);
  DSA_CHECK(receivers_.empty() && !finished_, "pipe_link: started twice or after finish");
  for (int peer : peers_) receivers_.emplace_back([this, peer, deliver] { receive_from(peer, deliver); });
}

status pipe_link::send(int process, std::uint32_t target, const link_payload& message) {
  byte_writer w;
  std::vector<tensor> payloads;
  if (const auto* p = std::get_if<produced>(&message)) {
    const auto& contents = slots_->at(p->ref);
    w.put(link_kind::produced);
    w.put(target);
    w.put(p->ref.edge);
    w.put(p->ref.slot);
    w.put(p->step);
    w.put(p->micro_batch);
    w.put(p->bytes);
    w.put(p->seq);
    w.put(static_cast<std::uint32_t>(contents.size()));
    for (const tensor& t : contents) {
      w.put(static_cast<std::uint8_t>(t.defined()));
      if (!t.defined()) continue;
      if (!t.dev().is_cpu())
        return make_error(errc::unsupported, "edge {} slot {} holds {}: only host tensors travel between processes",
                          slots_->edge_name(p->ref.edge), p->ref.slot, t.describe());
      if (t.ndim() > max_dims)
        return make_error(errc::unsupported, "edge {}: a tensor of {} dimensions (at most {} travel)",
                          slots_->edge_name(p->ref.edge), t.ndim(), max_dims);
      w.put(static_cast<std::uint8_t>(t.type()));
      w.put(static_cast<std::uint8_t>(t.ndim()));
      for (auto d : t.shape()) w.put(static_cast<std::int64_t>(d));
      payloads.push_back(t.is_contiguous() ? t : t.clone());
    }
  } else if (const auto* r = std::get_if<released>(&message)) {
    w.put(link_kind::released);
    w.put(target);
    w.put(r->ref.edge);
    w.put(r->ref.slot);
    w.put(r->seq);
  } else {
    const auto& g = std::get<grad_partial>(message);
    w.put(link_kind::grad_partial);
    w.put(target);
    w.put(g.stage);
    w.put(g.step);
    w.put(g.sum_of_squares);
  }
  std::lock_guard<std::mutex> lock(send_mutex_);
  // After finish() the peers have our end and read nothing more: a late message (a proxy
  // still emptying its mailbox while the run stops) is dropped, and no payload is left
  // for the transport to read after its slot is gone.
  if (finished_) return {};
  DSA_TRY(world_.send(process, pipe_link_tag, w.take()));
  if (const auto* p = std::get_if<produced>(&message)) // the flight recorder's edge counts (hangs)
    net::flight_recorder::instance().edge_sent(p->ref.edge, world_.world_rank(process), p->step, p->micro_batch);
  else if (const auto* c = std::get_if<released>(&message))
    net::flight_recorder::instance().credit_sent(c->ref.edge, world_.world_rank(process));
  if (payloads.empty()) return {};
  const auto& ref = std::get<produced>(message).ref;
  auto& pending = in_flight_[{ref.edge, ref.slot}];
  // The slot came back before the producer could write it again, so its last sends are
  // over (or failed: the abort reaches the run elsewhere); forget them.
  for (auto& f : pending) (void)f.ticket.wait();
  pending.clear();
  for (const tensor& t : payloads) {
    DSA_ASSIGN_OR_RETURN(net::send_ticket ticket,
                         world_.send_parts(process, pipe_link_tag, {}, t.raw_data(), t.nbytes()));
    sent_bytes_ += t.nbytes();
    pending.push_back({std::move(ticket), {t}});
  }
  return {};
}

status pipe_link::receive_one(int peer, const deliver_fn& deliver, bool& ended) {
  DSA_ASSIGN_OR_RETURN(net::bytes head, world_.recv(peer, pipe_link_tag));
  byte_reader r(head, fmt::format("a pipeline message from process {}", peer));
  DSA_ASSIGN_OR_RETURN(auto kind, r.get<link_kind>("kind"));
  if (kind == link_kind::end) {
    ended = true;
    return {};
  }
  DSA_ASSIGN_OR_RETURN(auto target, r.get<std::uint32_t>("target"));
  if (kind == link_kind::grad_partial) {
    grad_partial g;
    DSA_ASSIGN_OR_RETURN(g.stage, r.get<std::uint32_t>("stage"));
    DSA_ASSIGN_OR_RETURN(g.step, r.get<std::uint32_t>("step"));
    DSA_ASSIGN_OR_RETURN(g.sum_of_squares, r.get<double>("sum of squares"));
    deliver(target, g);
    return {};
  }
  if (kind != link_kind::produced && kind != link_kind::released)
    return make_error(errc::protocol, "pipeline message of unknown kind {} from process {}",
                      static_cast<int>(kind), peer);
  slot_ref ref;
  DSA_ASSIGN_OR_RETURN(ref.edge, r.get<std::uint32_t>("edge"));
  DSA_ASSIGN_OR_RETURN(ref.slot, r.get<std::uint32_t>("slot"));
  if (ref.edge >= slots_->edge_count() || ref.slot >= slots_->slot_count(ref.edge))
    return make_error(errc::protocol, "process {} names edge {} slot {}, which this process's plan does not have",
                      peer, ref.edge, ref.slot);
  if (kind == link_kind::released) {
    released m{ref, 0};
    DSA_ASSIGN_OR_RETURN(m.seq, r.get<std::uint64_t>("seq"));
    net::flight_recorder::instance().credit_received(ref.edge, world_.world_rank(peer));
    deliver(target, m);
    return {};
  }
  produced m;
  m.ref = ref;
  DSA_ASSIGN_OR_RETURN(m.step, r.get<std::uint32_t>("step"));
  DSA_ASSIGN_OR_RETURN(m.micro_batch, r.get<std::uint32_t>("micro-batch"));
  DSA_ASSIGN_OR_RETURN(m.bytes, r.get<std::uint64_t>("bytes"));
  DSA_ASSIGN_OR_RETURN(m.seq, r.get<std::uint64_t>("seq"));
  DSA_ASSIGN_OR_RETURN(auto count, r.get<std::uint32_t>("tensor count"));
  auto& contents = slots_->at(ref);
  if (count > 64) return make_error(errc::protocol, "edge {}: {} tensors in one slot", slots_->edge_name(ref.edge), count);
  contents.resize(count);
  // The heads first (the payloads follow as messages of their own, in this order).
  std::vector<tensor*> to_fill;
  for (std::uint32_t i = 0; i < count; ++i) {
    DSA_ASSIGN_OR_RETURN(auto defined, r.get<std::uint8_t>("tensor flag"));
    if (!defined) {
      contents[i] = tensor{};
      continue;
    }
    DSA_ASSIGN_OR_RETURN(auto type, r.get<std::uint8_t>("dtype"));
    DSA_ASSIGN_OR_RETURN(auto dims, r.get<std::uint8_t>("rank"));
    if (type > static_cast<std::uint8_t>(dtype::u8) || dims > max_dims)
      return make_error(errc::protocol, "edge {}: a tensor of dtype {} and {} dimensions", slots_->edge_name(ref.edge),
                        static_cast<int>(type), static_cast<int>(dims));
    shape_t shape(dims);
    for (auto& d : shape) {
      DSA_ASSIGN_OR_RETURN(d, r.get<std::int64_t>("dimension"));
      if (d < 0 || d > (std::int64_t{1} << 40))
        return make_error(errc::protocol, "edge {}: dimension {}", slots_->edge_name(ref.edge), d);
    }
    // Always a tensor of its own, never the slot's last one written in place: a consumer
    // may keep what it read after giving the slot back (a stage stashes its input for the
    // backward), as inside a process, where a producer puts a new tensor into the slot.
    contents[i] = tensor::empty(shape, static_cast<dtype>(type));
    to_fill.push_back(&contents[i]);
  }
  if (!r.at_end()) return make_error(errc::protocol, "edge {}: a head with trailing bytes", slots_->edge_name(ref.edge));
  for (tensor* t : to_fill) {
    DSA_ASSIGN_OR_RETURN(auto got, world_.recv_parts(peer, pipe_link_tag, 0, t->raw_data(), t->nbytes()));
    if (!got.placed)
      return make_error(errc::protocol, "edge {}: a payload of {} bytes where {} were announced",
                        slots_->edge_name(ref.edge), got.message.size(), t->nbytes());
  }
  net::flight_recorder::instance().edge_received(ref.edge, world_.world_rank(peer), m.step, m.micro_batch);
  deliver(target, m);
  return {};
}

void pipe_link::receive_from(int peer, deliver_fn deliver) {
  bool ended = false;
  while (!ended) {
    auto got = receive_one(peer, deliver, ended);
    if (got) continue;
    if (world_.aborted()) return; // the job is over: the abort reaches the run through the coordinator
    log_error("pipeline link: {}", got.err().message);
    world_.abort(make_error(errc::protocol, "process {}: a malformed pipeline message from process {}: {}",
                            world_.rank(), peer, got.err().message));
    return;
  }
}

void pipe_link::finish() {
  {
    std::lock_guard<std::mutex> lock(send_mutex_);
    if (finished_) return;
    finished_ = true; // from here send() drops: nothing follows the end on the wire
    if (!receivers_.empty()) {
      byte_writer w;
      w.put(link_kind::end);
      const auto end = w.take();
      for (int peer : peers_) (void)world_.send(peer, pipe_link_tag, end);
    }
  }
  for (auto& t : receivers_) t.join();
  receivers_.clear();
  std::lock_guard<std::mutex> lock(send_mutex_);
  for (auto& [slot, sends] : in_flight_)
    for (auto& f : sends) (void)f.ticket.wait();
  in_flight_.clear();
}

} // namespace dsa::actors
