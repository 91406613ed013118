// The flight recorder for hangs; see flight_recorder.hpp.
#include "io/net/flight_recorder.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <tuple>

namespace dsa::net {

namespace {

constexpr std::uint32_t flight_magic = 0x46415344u; // "DSAF"
constexpr std::uint32_t flight_version = 1;
constexpr std::uint32_t max_group = 1u << 20, max_items = 1u << 20;

std::atomic<const char*> g_dump_request{nullptr};
static_assert(std::atomic<const char*>::is_always_lock_free, "request_flight_dump must be async-signal-safe");

class writer {
public:
  template <class T> void put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.append(b, sizeof(T));
  }
  void put_string(const std::string& s) {
    put(static_cast<std::uint32_t>(s.size()));
    out += s;
  }
  std::string out;
};

class reader {
public:
  explicit reader(std::string_view d) : data(d) {}
  template <class T> bool get(T& v) {
    if (data.size() - pos < sizeof(T)) return false;
    std::memcpy(&v, data.data() + pos, sizeof(T));
    pos += sizeof(T);
    return true;
  }
  bool get_string(std::string& s) {
    std::uint32_t n = 0;
    if (!get(n) || data.size() - pos < n) return false;
    s.assign(data.data() + pos, n);
    pos += n;
    return true;
  }
  std::string_view data;
  std::size_t pos = 0;
};

} // namespace

std::uint64_t flight_now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

std::string encode_flight(const flight_record& r) {
  writer w;
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
  for (const auto& e : r.edges) {
    w.put(e.edge);
    w.put(e.peer);
    w.put(e.sent);
    w.put(e.received);
    w.put(e.last_sent_step);
    w.put(e.last_sent_micro);
    w.put(e.last_received_step);
    w.put(e.last_received_micro);
    w.put(e.last_sent_ns);
    w.put(e.last_received_ns);
  }
  return std::move(w.out);
}

expected<flight_record> decode_flight(std::string_view payload) {
  reader in(payload);
  auto bad = [&](const char* what) {
    return make_error(errc::format, "flight record: {} at byte {} of {}", what, in.pos, payload.size());
  };
  std::uint32_t magic = 0, version = 0, n = 0;
  if (!in.get(magic) || magic != flight_magic) return bad("no flight record header");
  if (!in.get(version) || version != flight_version) return bad("unknown version");
  flight_record r;
  if (!in.get(r.rank) || !in.get_string(r.reason) || !in.get(r.at_ns) || !in.get(r.calls_dropped) || !in.get(n))
    return bad("truncated header");
  if (n > max_items) return bad("too many calls");
  for (std::uint32_t i = 0; i < n; ++i) {
    flight_call c;
    std::uint8_t kind = 0, type = 0, outcome = 0;
    std::uint32_t g = 0;
    if (!in.get(c.channel) || !in.get(c.seq) || !in.get(kind) || !in.get(type) || !in.get(outcome) ||
        !in.get(c.count) || !in.get(c.bytes) || !in.get(c.rank) || !in.get(g))
      return bad("truncated call");
    if (outcome > 2) return bad("unknown call outcome");
    if (kind < static_cast<std::uint8_t>(op_kind::allreduce_flat) || kind > static_cast<std::uint8_t>(op_kind::allreduce_shared))
      return bad("unknown collective kind");
    if (type > static_cast<std::uint8_t>(dtype::u8)) return bad("unknown dtype");
    if (g > max_group || (payload.size() - in.pos) / sizeof(std::int32_t) < g) return bad("truncated group");
    c.kind = static_cast<op_kind>(kind);
    c.type = static_cast<dtype>(type);
    c.outcome = static_cast<flight_call::state>(outcome);
    c.group.resize(g);
    for (auto& m : c.group)
      if (!in.get(m)) return bad("truncated group");
    if (!in.get(c.start_ns) || !in.get(c.end_ns)) return bad("truncated call");
    r.calls.push_back(std::move(c));
  }
  if (!in.get(n)) return bad("truncated edges");
  if (n > max_items) return bad("too many edges");
  for (std::uint32_t i = 0; i < n; ++i) {
    flight_edge e;
    if (!in.get(e.edge) || !in.get(e.peer) || !in.get(e.sent) || !in.get(e.received) || !in.get(e.last_sent_step) ||
        !in.get(e.last_sent_micro) || !in.get(e.last_received_step) || !in.get(e.last_received_micro) ||
        !in.get(e.last_sent_ns) || !in.get(e.last_received_ns))
      return bad("truncated edge");
    r.edges.push_back(e);
  }
  if (in.pos != payload.size()) return bad("bytes after the record");
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

std::uint64_t flight_recorder::enter(flight_call call) {
  call.start_ns = flight_now_ns();
  call.outcome = flight_call::state::running;
  std::lock_guard<std::mutex> lock(mutex_);
  const std::uint64_t token = next_++;
  auto& slot = ring_[token % capacity];
  if (token >= first_ + capacity && slot.outcome == flight_call::state::running)
    evicted_running_.emplace(token - capacity, std::move(slot));
  slot = std::move(call);
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
