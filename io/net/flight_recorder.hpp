// The flight recorder for hangs: each process keeps a small ring of its recent collectives
// (channel, sequence number, kind, bytes, the group's world ranks, when it began and
// ended) and, per pipeline edge to another process, how many messages it sent and
// received and the last of each. When a run hangs or stops (the watchdog, a lost peer,
// SIGUSR1, Ctrl-C) each process writes a snapshot into its trace (a `flight` frame), and
// `dsactor trace hang RUN` lines the processes up (actors/trace/analysis/trace_hang.hpp).
//
// One recorder per process (instance()); every method is thread-safe, and
// request_flight_dump() is async-signal-safe (a signal handler asks, the trace writer's
// thread writes). Times are steady-clock nanoseconds of this process: a report compares
// each with the same process's snapshot time, never across processes.
#pragma once

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "io/net/wire.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace dsa::net {

struct flight_call {
  enum class state : std::uint8_t { running = 0, done = 1, failed = 2 };
  std::uint32_t channel = 0;
  std::uint64_t seq = 0; // the call's number on its channel (0 = the channel's first call)
  op_kind kind = op_kind::barrier;
  dtype type = dtype::u8;
  std::int64_t count = 0;
  std::int64_t bytes = 0;  // count x the dtype's size (all_to_all: x the group size, every block)
  std::int32_t rank = 0;   // this process's rank in the group
  std::vector<std::int32_t> group; // the group's world ranks, in group rank order
  std::uint64_t start_ns = 0, end_ns = 0;
  state outcome = state::running;
};

// Messages of one pipeline edge between this process and `peer` (a world rank): the
// activations or gradients (`produced`) one way, and the slots given back (credits,
// `released`) the other. The base is what a version-1 record holds.
struct flight_edge_messages {
  std::uint32_t edge = 0;
  std::int32_t peer = 0;
  std::uint64_t sent = 0, received = 0;
  std::uint32_t last_sent_step = 0, last_sent_micro = 0, last_received_step = 0, last_received_micro = 0;
  std::uint64_t last_sent_ns = 0, last_received_ns = 0;
};
struct flight_edge : flight_edge_messages {
  std::uint64_t credits_sent = 0, credits_received = 0; // slots given back to / by `peer`
};

struct flight_record {
  std::int32_t rank = -1; // this process's world rank
  std::string reason;     // why it was written
  std::uint64_t at_ns = 0;
  std::vector<flight_call> calls; // oldest first
  std::vector<flight_edge> edges; // by (edge, peer)
  std::uint64_t calls_dropped = 0; // older calls the ring no longer holds
};

// The bytes of a `flight` trace frame, and back (errc::format naming what is wrong).
std::string encode_flight(const flight_record& record);
expected<flight_record> decode_flight(std::string_view payload);

class flight_recorder {
public:
  static constexpr std::size_t capacity = 256;
  static flight_recorder& instance();

  void set_rank(std::int32_t world_rank);
  // A collective begins; the returned token ends it.
  // (The group's world ranks apart from `call`, whose own group is not read: the caller keeps
  // one vector for all its calls and the slot copies it into the vector it has.)
  std::uint64_t enter(const flight_call& call, const std::vector<std::int32_t>& group);
  std::uint64_t enter(const flight_call& call) { return enter(call, call.group); }
  void leave(std::uint64_t token, bool ok);
  // A pipeline message of (step, micro-batch) sent to / received from world rank `peer`.
  void edge_sent(std::uint32_t edge, std::int32_t peer, std::uint32_t step, std::uint32_t micro) {
    count_edge(edge, peer, step, micro, true);
  }
  void edge_received(std::uint32_t edge, std::int32_t peer, std::uint32_t step, std::uint32_t micro) {
    count_edge(edge, peer, step, micro, false);
  }
  // A slot of `edge` given back to (its producer) / by (its consumer) world rank `peer`.
  void credit_sent(std::uint32_t edge, std::int32_t peer) { count_credit(edge, peer, true); }
  void credit_received(std::uint32_t edge, std::int32_t peer) { count_credit(edge, peer, false); }

  flight_record snapshot(std::string reason) const;
  // Takes a snapshot now for the trace writer to write (a run that fails: before it
  // aborts the group, so the calls it waits in still show as running).
  void capture(std::string reason);
  // The captured snapshots, and one taken now when request_flight_dump() was called;
  // forgotten here (the trace writer's thread and its finish() call it).
  std::vector<flight_record> take_pending();
  void clear(); // a new run in this process

private:
  void count_edge(std::uint32_t edge, std::int32_t peer, std::uint32_t step, std::uint32_t micro, bool sent);
  void count_credit(std::uint32_t edge, std::int32_t peer, bool sent);

  mutable std::mutex mutex_;
  std::int32_t rank_ = -1;
  std::vector<flight_call> ring_ = std::vector<flight_call>(capacity);
  std::uint64_t next_ = 0;  // tokens handed out (never reused); slot = token % capacity
  std::uint64_t first_ = 0; // the first token of this run (clear())
  // Calls still running when newer ones took their slot: kept until they end (the call a
  // hang is stuck in must not fall out of the record however busy other channels are).
  std::map<std::uint64_t, flight_call> evicted_running_;
  std::vector<flight_edge> edges_;
  std::vector<flight_record> captured_;
};

std::uint64_t flight_now_ns();

// Async-signal-safe: asks the trace writer to write a snapshot (`why`: a static string).
void request_flight_dump(const char* why);
// The pending request's reason, cleared; null when none.
const char* take_flight_dump_request();

} // namespace dsa::net
