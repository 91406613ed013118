// The rendezvous of a multi-process job: what its server and clients share (options, the
// config summary and how two are compared). The server is rendezvous_server.hpp, a rank's
// end rendezvous_client.hpp, the launcher's environment variables rendezvous_env.hpp.
//
// How a job meets (plain TCP, one connection per rank to the server the launcher hosts):
//   1. each rank connects and sends `hello`: a magic number and version, the job token, its
//      rank, the world size, its config summary and a blob (e.g. its UCX worker address);
//   2. a wrong token is refused (an `abort` frame the client reads, then close) and logged
//      with the peer's address; it never counts as a member;
//   3. when all world_size ranks joined and every config summary equals rank 0's, each rank
//      gets every rank's blob (`welcome`); otherwise each gets an `abort` naming the keys;
//   4. the connections stay open: both sides send `heartbeat` every heartbeat_interval; a
//      connection that closes without `leave`, or is silent for heartbeat_timeout, makes the
//      server send every other rank `abort` "rank r lost (why)" and the job has failed;
//   5. a rank ends with `leave` (answered by `bye`); when every rank left, the server ends.
// Between 3 and 5 a rank may `gather` a blob under a key; when every rank sent that key each
// gets every rank's blob (`gathered`): an allgather, or with empty blobs a barrier.
#pragma once

#include "core/error.hpp"
#include "io/net/transport.hpp" // bytes

#include <toml++/toml.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>

namespace dsa::net {

// Effective config key -> value text. Ranks of one job must present equal summaries.
using config_summary = std::map<std::string, std::string>;

struct rendezvous_options {
  // Both sides send a heartbeat this often, from their own thread.
  std::chrono::milliseconds heartbeat_interval{1000};
  // A peer silent this long is lost (a rank for the server, the server for a rank).
  std::chrono::milliseconds heartbeat_timeout{10000};
  // Client: keep retrying a refused connection this long (the server may start later).
  std::chrono::milliseconds connect_timeout{30000};
  // Client: wait this long for every rank to join, and for an allgather to complete.
  std::chrono::milliseconds join_timeout{600000};
};

// Every leaf of a config table as "a.b.c" -> its value as TOML text (strings quoted, arrays
// inline), e.g. the effective config of `dsactor run` (dsa::config::table()).
config_summary summarize_config(const toml::table& table);

// "" when a and b are equal; otherwise the differing keys with both values, e.g.
// "rank 1's config differs from rank 0's: optimizer.params.lr = 0.001 vs 0.0002".
// A key one side lacks shows as "(unset)"; past 8 keys the rest are counted.
std::string config_difference(const config_summary& rank0, const config_summary& other,
                              int other_rank);

// The rank a failure message names as lost: the first "rank N lost" in it (the form the
// rendezvous server and the transports use), else nothing.
std::optional<int> lost_rank_in(const std::string& message);

} // namespace dsa::net
