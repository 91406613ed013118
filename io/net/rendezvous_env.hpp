// The environment a launcher gives each process of a job (`dsactor launch`, and the names
// DeepSpeed's and torchrun's launchers use), read into a struct.
#pragma once

#include "core/error.hpp"
#include "io/net/rendezvous_client.hpp"

#include <chrono>
#include <optional>
#include <string>

namespace dsa::net {

struct rendezvous_env {
  int rank = 0;                  // RANK: 0..world_size-1
  int world_size = 1;            // WORLD_SIZE
  int local_rank = 0;            // LOCAL_RANK: index among the job's processes on this host
  std::optional<int> local_size; // LOCAL_SIZE, when set
  std::string master_addr;       // MASTER_ADDR: where the rendezvous server listens
  int master_port = 0;           // MASTER_PORT
  std::string job_token;         // DSA_JOB_TOKEN: every connection must present it
  // DSA_HEARTBEAT_TIMEOUT_MS, when set (dsactor launch --heartbeat_timeout): the job's
  // heartbeat timeout, so that ranks heartbeat often enough for the server.
  std::optional<std::chrono::milliseconds> heartbeat_timeout;
};

// Under `dsactor launch --launcher mpirun` or `slurm` the rank and local rank come from
// OpenMPI's OMPI_COMM_WORLD_RANK / _LOCAL_RANK / _LOCAL_SIZE or Slurm's SLURM_PROCID /
// SLURM_LOCALID when RANK / LOCAL_RANK / LOCAL_SIZE are not set.
// nullopt when WORLD_SIZE is unset (a plain single-process run). Otherwise every variable
// above but LOCAL_SIZE and DSA_HEARTBEAT_TIMEOUT_MS must be set and well formed; the error names
// the first that is not
// ("RANK is not set", "MASTER_PORT='x' is not an integer in 1..65535", ...).
expected<std::optional<rendezvous_env>> read_rendezvous_env();

// Default options, with env's heartbeat timeout and a heartbeat interval of a quarter of
// it (at most 1 s) when the launcher set one.
rendezvous_options make_rendezvous_options(const rendezvous_env& env);

// The join_request for this process: env's server, token, rank and world size.
join_request make_join_request(const rendezvous_env& env, config_summary config, bytes blob);

} // namespace dsa::net
