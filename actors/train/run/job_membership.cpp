// A process's membership of a launched job; see job_membership.hpp.
#include "actors/train/run/job_membership.hpp"

#include "actors/train/config/offload_config.hpp"
#include "actors/train/run/signals.hpp"
#include "core/log.hpp"
#include "io/net/flight_recorder.hpp"
#include "io/net/route_address.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include <unistd.h>

namespace dsa::train {
namespace {
// The UCX messages' job number from the launcher's token (FNV-1a of its text).
std::uint64_t token_number(const std::string& token) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : token) h = (h ^ c) * 1099511628211ull;
  return h;
}


// UCX's TCP endpoints on the interface that routes to the rendezvous (as the launcher's
// server listens on it), not every interface, unless UCX_NET_DEVICES says otherwise, the
// job is on this host alone (the rendezvous on loopback: shared memory carries it), or the
// host has RDMA devices (naming one interface would leave InfiniBand out).
void pin_ucx_interface(const net::rendezvous_env& env) {
  if (std::getenv("UCX_NET_DEVICES")) return;
  std::error_code ec;
  if (std::filesystem::exists("/sys/class/infiniband", ec) &&
      !std::filesystem::is_empty("/sys/class/infiniband", ec))
    return;
  auto mine = net::local_address_towards(env.master_addr);
  if (!mine || net::is_loopback(*mine)) return;
  auto device = net::interface_of(*mine);
  if (!device) return;
  ::setenv("UCX_NET_DEVICES", device->c_str(), 0);
  if (env.rank == 0) log_info("UCX_NET_DEVICES={}: the interface that routes to the rendezvous at {}", *device, env.master_addr);
}

constexpr std::chrono::seconds lost_job_grace{20};

} // namespace

expected<job_membership> join_job(const net::rendezvous_env& env, const config& cfg) {
  job_membership job;
  job.env = env;
  pin_ucx_interface(env);
  DSA_ASSIGN_OR_RETURN(job.transport, net::ucx_transport::create(env.rank, env.world_size, token_number(env.job_token)));
  // Liveness comes from heartbeats and the launcher: waits at the rendezvous (all ranks
  // joining, rank 0 preparing the data) get no deadline of their own.
  net::rendezvous_options options = net::make_rendezvous_options(env);
  options.join_timeout = std::chrono::hours(24 * 7);
  DSA_ASSIGN_OR_RETURN(job.client,
                       net::rendezvous_client::join(
                           net::make_join_request(env, net::summarize_config(cfg.table()), job.transport->local_address()),
                           options));
  DSA_TRY(job.transport->connect(job.client->blobs()));
  // A lost rank or server fails every collective this process waits in.
  job.client->set_on_lost([t = job.transport.get()](const error& e) {
    t->abort(e);
    swap_area::remove_all_now(); // the run fails now: before a shutdown that may block
    // A rank whose job is lost ends within lost_job_grace even if its shutdown blocks (a
    // call into a peer that never answers): the job's other processes must not linger.
    std::thread([why = e.message] {
      std::this_thread::sleep_for(lost_job_grace);
      log_error("the job was lost {} s ago ({}) and this rank has not ended yet; exiting",
                std::chrono::duration_cast<std::chrono::seconds>(lost_job_grace).count(), why);
      std::_Exit(1);
    }).detach();
  });
  job.client->set_on_interrupt([] { request_stop(); }); // the launcher's Ctrl-C, on any host
  job.client->set_on_flight_dump([] { // the launcher's SIGUSR1, on any host
    log_warn("the launcher got SIGUSR1: writing a flight record into the trace (dsactor trace hang RUN)");
    net::request_flight_dump("SIGUSR1");
  });
  return job;
}

net::bytes to_bytes(const std::string& s) {
  net::bytes b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

} // namespace dsa::train
