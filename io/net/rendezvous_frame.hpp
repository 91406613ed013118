// The rendezvous wire format: length-prefixed frames, their types, and the encoders and
// checked decoders of their payloads. Every decoder treats its input as untrusted: a short
// or overlong payload is an errc::protocol error, never a crash.
#pragma once

#include "io/net/rendezvous.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dsa::net {

// A frame is [u32 length][u8 type][payload], length = 1 + payload bytes, little-endian.
enum class frame_type : std::uint8_t {
  hello = 1, // client: hello_msg
  welcome,   // server: every rank's blob (index = rank)
  abort,     // server: errc and text; the job failed or this connection was refused
  heartbeat, // both: empty
  leave,     // client: empty; a clean end
  bye,       // server: empty; the answer to leave
  gather,    // client: key and blob
  gathered,  // server: key and every rank's blob
  clock_probe, // client: clock_msg with the probe's sequence number (time 0)
  clock_reply, // server: clock_msg with the same sequence and the server's steady clock
  interrupt,   // server: empty; the launcher was interrupted (Ctrl-C): stop after the step
  flight_dump, // server: empty; the launcher got SIGUSR1: write a flight record, run on
};

inline constexpr std::uint32_t hello_magic = 0x52415344; // "DSAR"
inline constexpr std::uint32_t hello_version = 1;

// Frame size limits: before a connection presented the token, and after.
inline constexpr std::size_t max_hello_frame_bytes = std::size_t(1) << 20;
inline constexpr std::size_t max_frame_bytes = std::size_t(64) << 20;

struct frame {
  frame_type type = frame_type::heartbeat;
  bytes payload;
};

struct hello_msg {
  std::string job_token;
  int rank = 0;
  int world_size = 0;
  config_summary config;
  bytes blob;
};

struct abort_msg {
  errc code = errc::runtime;
  std::string text;
};

// A clock probe and its answer (rendezvous_client::estimate_server_clock).
struct clock_msg {
  std::uint64_t sequence = 0;
  std::uint64_t steady_ns = 0; // the server's std::chrono::steady_clock when it answered
};

struct keyed_blobs { // gather (one blob) and gathered (one per rank)
  std::string key;
  std::vector<bytes> blobs;
};

bytes encode_frame(frame_type type, const bytes& payload = {});
bytes encode_hello(const hello_msg& m);
bytes encode_blobs(const std::vector<bytes>& blobs);
bytes encode_abort(const abort_msg& m);
bytes encode_keyed(const keyed_blobs& m);
bytes encode_clock(const clock_msg& m);

expected<hello_msg> decode_hello(const bytes& payload);
expected<std::vector<bytes>> decode_blobs(const bytes& payload);
expected<abort_msg> decode_abort(const bytes& payload);
expected<keyed_blobs> decode_keyed(const bytes& payload);
expected<clock_msg> decode_clock(const bytes& payload);

// Collects received bytes and cuts them into frames.
class frame_buffer {
public:
  void append(const std::byte* data, std::size_t n);
  // The next whole frame, nullopt while incomplete; an error for a frame over `limit`
  // bytes, an empty one, or an unknown type. `peer` names the sender in errors.
  expected<std::optional<frame>> next(std::size_t limit, const std::string& peer);

private:
  bytes data_;
  std::size_t start_ = 0;
};

} // namespace dsa::net
