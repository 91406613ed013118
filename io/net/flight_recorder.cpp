// The flight recorder for hangs; see flight_recorder.hpp.
#include "io/net/flight_recorder.hpp"

#include "core/byte_codec.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <tuple>

namespace dsa::net {

namespace {

constexpr std::uint32_t flight_magic = 0x46415344u; // "DSAF"
constexpr std::uint32_t flight_version = 2; // 1: edges without the credit counts
constexpr std::uint32_t max_group = 1u << 20, max_items = 1u << 20;

std::atomic<const char*> g_dump_request{nullptr};
static_assert(std::atomic<const char*>::is_always_lock_free, "request_flight_dump must be async-signal-safe");

} // namespace

std::uint64_t flight_now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

std::string encode_flight(const flight_record& r) {
  byte_writer w;
  w.put(flight_magic);
  w.put(flight_version);
  w.put(r.rank);
  w.put_string(r.reason);
  w.put(r.at_ns);
  w.put(r.calls_dropped);
  w.put(static_cast<std::uint32_t>(r.calls.size()));
  for (const auto& c : r.calls) {
    w.put(c.channel);
    w.put(c.seq);
    w.put(static_cast<std::uint8_t>(c.kind));
    w.put(static_cast<std::uint8_t>(c.type));
    w.put(static_cast<std::uint8_t>(c.outcome));
    w.put(c.count);
    w.put(c.bytes);
    w.put(c.rank);
    w.put(static_cast<std::uint32_t>(c.group.size()));
    for (auto g : c.group) w.put(g);
    w.put(c.start_ns);
    w.put(c.end_ns);
  }
  w.put(static_cast<std::uint32_t>(r.edges.size()));
  for (const auto& e : r.edges) w.put(e); // plain fields: copied whole
  const auto bytes = w.take();
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

expected<flight_record> decode_flight(std::string_view payload) {
  const auto* p = reinterpret_cast<const std::byte*>(payload.data());
  const std::vector<std::byte> bytes(p, p + payload.size());
  byte_reader in(bytes, "flight record");
  auto bad = [&](const char* what) {
    return make_error(errc::format, "flight record: {} ({} bytes)", what, payload.size());
  };
  DSA_ASSIGN_OR_RETURN(auto magic, in.get<std::uint32_t>("magic"));
  if (magic != flight_magic) return bad("no flight record header");
  DSA_ASSIGN_OR_RETURN(auto version, in.get<std::uint32_t>("version"));
  if (version != flight_version && version != 1) return bad("unknown version");
  flight_record r;
  DSA_ASSIGN_OR_RETURN(r.rank, in.get<std::int32_t>("rank"));
  DSA_ASSIGN_OR_RETURN(r.reason, in.get_string("reason"));
  DSA_ASSIGN_OR_RETURN(r.at_ns, in.get<std::uint64_t>("time"));
  DSA_ASSIGN_OR_RETURN(r.calls_dropped, in.get<std::uint64_t>("dropped calls"));
  DSA_ASSIGN_OR_RETURN(auto n, in.get<std::uint32_t>("call count"));
  if (n > max_items) return bad("too many calls");
  for (std::uint32_t i = 0; i < n; ++i) {
    flight_call c;
    DSA_ASSIGN_OR_RETURN(c.channel, in.get<std::uint32_t>("channel"));
    DSA_ASSIGN_OR_RETURN(c.seq, in.get<std::uint64_t>("sequence"));
    DSA_ASSIGN_OR_RETURN(auto kind, in.get<std::uint8_t>("kind"));
    DSA_ASSIGN_OR_RETURN(auto type, in.get<std::uint8_t>("dtype"));
    DSA_ASSIGN_OR_RETURN(auto outcome, in.get<std::uint8_t>("outcome"));
    if (outcome > 2) return bad("unknown call outcome");
    if (kind < static_cast<std::uint8_t>(op_kind::allreduce_flat) || kind > static_cast<std::uint8_t>(op_kind::allreduce_shared))
      return bad("unknown collective kind");
    if (type > static_cast<std::uint8_t>(dtype::u8)) return bad("unknown dtype");
    c.kind = static_cast<op_kind>(kind);
    c.type = static_cast<dtype>(type);
    c.outcome = static_cast<flight_call::state>(outcome);
    DSA_ASSIGN_OR_RETURN(c.count, in.get<std::int64_t>("count"));
    DSA_ASSIGN_OR_RETURN(c.bytes, in.get<std::int64_t>("bytes"));
    DSA_ASSIGN_OR_RETURN(c.rank, in.get<std::int32_t>("group rank"));
    DSA_ASSIGN_OR_RETURN(auto g, in.get<std::uint32_t>("group size"));
    if (g > max_group) return bad("too large a group");
    for (std::uint32_t k = 0; k < g; ++k) {
      DSA_ASSIGN_OR_RETURN(auto member, in.get<std::int32_t>("group member"));
      c.group.push_back(member);
    }
    DSA_ASSIGN_OR_RETURN(c.start_ns, in.get<std::uint64_t>("start"));
    DSA_ASSIGN_OR_RETURN(c.end_ns, in.get<std::uint64_t>("end"));
    r.calls.push_back(std::move(c));
  }
  DSA_ASSIGN_OR_RETURN(n, in.get<std::uint32_t>("edge count"));
  if (n > max_items) return bad("too many edges");
  for (std::uint32_t i = 0; i < n; ++i) {
    if (version == 1) { // no credit counts
      flight_edge e;
      DSA_ASSIGN_OR_RETURN(static_cast<flight_edge_messages&>(e), in.get<flight_edge_messages>("edge"));
      r.edges.push_back(e);
      continue;
    }
    DSA_ASSIGN_OR_RETURN(auto e, in.get<flight_edge>("edge"));
    r.edges.push_back(e);
  }
  if (!in.at_end()) return bad("bytes after the record");
  return r;
}

flight_recorder& flight_recorder::instance() {
  static flight_recorder recorder;
  return recorder;
}

void flight_recorder::set_rank(std::int32_t world_rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  rank_ = world_rank;
}

std::uint64_t flight_recorder::enter(const flight_call& call, const std::vector<std::int32_t>& group) {
  const std::uint64_t now = flight_now_ns();
  std::lock_guard<std::mutex> lock(mutex_);
  const std::uint64_t token = next_++;
  auto& slot = ring_[token % capacity];
  if (token >= first_ + capacity && slot.outcome == flight_call::state::running)
    evicted_running_.emplace(token - capacity, slot);
  // Field by field, the group into the slot's own vector: once the ring has gone round, a
  // collective's entry allocates nothing.
  slot.channel = call.channel;
  slot.seq = call.seq;
  slot.kind = call.kind;
  slot.type = call.type;
  slot.count = call.count;
  slot.bytes = call.bytes;
  slot.rank = call.rank;
  slot.group.assign(group.begin(), group.end());
  slot.start_ns = now;
  slot.end_ns = 0;
  slot.outcome = flight_call::state::running;
  return token;
}

void flight_recorder::leave(std::uint64_t token, bool ok) {
  const std::uint64_t now = flight_now_ns();
  std::lock_guard<std::mutex> lock(mutex_);
  if (token < first_ || token >= next_) return; // a call of an earlier run
  if (next_ - token > capacity) { // its slot went to a newer call: it was kept aside, and is over now
    evicted_running_.erase(token);
    return;
  }
  auto& c = ring_[token % capacity];
  c.end_ns = now;
  c.outcome = ok ? flight_call::state::done : flight_call::state::failed;
}

namespace {

flight_edge& edge_of(std::vector<flight_edge>& edges, std::uint32_t edge, std::int32_t peer) {
  auto it = std::find_if(edges.begin(), edges.end(), [&](const flight_edge& e) { return e.edge == edge && e.peer == peer; });
  if (it != edges.end()) return *it;
  flight_edge e;
  e.edge = edge;
  e.peer = peer;
  edges.push_back(e);
  std::sort(edges.begin(), edges.end(),
            [](const flight_edge& a, const flight_edge& b) { return std::tie(a.edge, a.peer) < std::tie(b.edge, b.peer); });
  return edge_of(edges, edge, peer);
}

} // namespace

void flight_recorder::count_edge(std::uint32_t edge, std::int32_t peer, std::uint32_t step, std::uint32_t micro,
                                 bool sent) {
  const std::uint64_t now = flight_now_ns();
  std::lock_guard<std::mutex> lock(mutex_);
  auto& e = edge_of(edges_, edge, peer);
  ++(sent ? e.sent : e.received);
  (sent ? e.last_sent_step : e.last_received_step) = step;
  (sent ? e.last_sent_micro : e.last_received_micro) = micro;
  (sent ? e.last_sent_ns : e.last_received_ns) = now;
}

void flight_recorder::count_credit(std::uint32_t edge, std::int32_t peer, bool sent) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++(sent ? edge_of(edges_, edge, peer).credits_sent : edge_of(edges_, edge, peer).credits_received);
}

flight_record flight_recorder::snapshot(std::string reason) const {
  flight_record r;
  r.reason = std::move(reason);
  r.at_ns = flight_now_ns();
  std::lock_guard<std::mutex> lock(mutex_);
  r.rank = rank_;
  const std::uint64_t first = std::max(first_, next_ > capacity ? next_ - capacity : 0);
  r.calls_dropped = first - first_ - evicted_running_.size();
  for (const auto& [token, c] : evicted_running_) r.calls.push_back(c); // older than the ring's
  for (std::uint64_t t = first; t < next_; ++t) r.calls.push_back(ring_[t % capacity]);
  r.edges = edges_;
  return r;
}

void flight_recorder::capture(std::string reason) {
  auto r = snapshot(std::move(reason));
  std::lock_guard<std::mutex> lock(mutex_);
  captured_.push_back(std::move(r));
}

std::vector<flight_record> flight_recorder::take_pending() {
  std::vector<flight_record> out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    out.swap(captured_);
  }
  if (const char* why = take_flight_dump_request()) out.push_back(snapshot(why));
  return out;
}

void flight_recorder::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  first_ = next_; // an earlier run's tokens no longer mark anything
  evicted_running_.clear();
  edges_.clear();
  captured_.clear();
}

void request_flight_dump(const char* why) { g_dump_request.store(why); }

const char* take_flight_dump_request() { return g_dump_request.exchange(nullptr); }

} // namespace dsa::net
