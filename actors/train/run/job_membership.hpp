// This process as one rank of a job started by `dsactor launch` (RANK, WORLD_SIZE, ... in
// the environment): its UCX transport to the other processes and its rendezvous
// membership, which reports a lost rank by aborting the transport (and ends the process
// lost_job_grace later should its shutdown block) and the launcher's Ctrl-C by
// request_stop().
#pragma once

#include "core/config.hpp"
#include "core/error.hpp"
#include "io/net/rendezvous_client.hpp"
#include "io/net/rendezvous_env.hpp"
#include "io/net/ucx_transport.hpp"

#include <memory>
#include <string>

namespace dsa::train {

struct job_membership {
  net::rendezvous_env env;
  std::unique_ptr<net::ucx_transport> transport;
  std::unique_ptr<net::rendezvous_client> client;
};

// Pins UCX to the interface towards the rendezvous (unless UCX_NET_DEVICES is set, the
// rendezvous is on loopback or the host has RDMA devices), creates the transport, joins
// the rendezvous (every process must run the same config: a difference is an errc::config
// error naming the keys) and connects to every rank.
expected<job_membership> join_job(const net::rendezvous_env& env, const config& cfg);

// `s`'s bytes, for a rendezvous allgather.
net::bytes to_bytes(const std::string& s);

// This machine's name (gethostname), for the log of a rank in a job; "?" when unknown.
std::string host_name();

} // namespace dsa::train
