// Reading the launcher's environment variables; see rendezvous_env.hpp.
#include "io/net/rendezvous_env.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <initializer_list>

namespace dsa::net {
namespace {

expected<std::string> required(const char* name) {
  const char* v = std::getenv(name);
  if (!v)
    return make_error(errc::config, "{} is not set (it is set by 'dsactor launch')", name);
  if (!*v)
    return make_error(errc::config, "{} is set but empty", name);
  return std::string(v);
}

expected<int> integer(const char* name, long low, long high) {
  DSA_ASSIGN_OR_RETURN(std::string text, required(name));
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != '\0' || v < low || v > high)
    return make_error(errc::config, "{}='{}' is not an integer in {}..{}", name, text, low, high);
  return static_cast<int>(v);
}

// The first of `names` that is set (a rank's number comes as RANK from dsactor launch,
// OMPI_COMM_WORLD_RANK under OpenMPI's mpirun, SLURM_PROCID under srun); the first name
// when none is, so the error names it.
const char* first_set(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (std::getenv(n)) return n;
  return *names.begin();
}

} // namespace

expected<std::optional<rendezvous_env>> read_rendezvous_env() {
  if (!std::getenv("WORLD_SIZE"))
    return std::optional<rendezvous_env>();
  constexpr long max_ranks = 1 << 20;
  rendezvous_env env;
  DSA_ASSIGN_OR_RETURN(env.world_size, integer("WORLD_SIZE", 1, max_ranks));
  DSA_ASSIGN_OR_RETURN(env.rank, integer(first_set({"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}), 0,
                                          env.world_size - 1));
  DSA_ASSIGN_OR_RETURN(env.local_rank, integer(first_set({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}),
                                                0, env.world_size - 1));
  if (const char* name = first_set({"LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}); std::getenv(name)) {
    DSA_ASSIGN_OR_RETURN(int local_size, integer(name, 1, env.world_size));
    if (env.local_rank >= local_size)
      return make_error(errc::config, "LOCAL_RANK={} is not below LOCAL_SIZE={}", env.local_rank,
                        local_size);
    env.local_size = local_size;
  }
  DSA_ASSIGN_OR_RETURN(env.master_addr, required("MASTER_ADDR"));
  DSA_ASSIGN_OR_RETURN(env.master_port, integer("MASTER_PORT", 1, 65535));
  DSA_ASSIGN_OR_RETURN(env.job_token, required("DSA_JOB_TOKEN"));
  if (std::getenv("DSA_HEARTBEAT_TIMEOUT_MS")) {
    DSA_ASSIGN_OR_RETURN(int timeout_ms, integer("DSA_HEARTBEAT_TIMEOUT_MS", 1, 24 * 3600 * 1000));
    env.heartbeat_timeout = std::chrono::milliseconds(timeout_ms);
  }
  return std::optional<rendezvous_env>(std::move(env));
}

rendezvous_options make_rendezvous_options(const rendezvous_env& env) {
  rendezvous_options options;
  if (env.heartbeat_timeout) {
    options.heartbeat_timeout = *env.heartbeat_timeout;
    options.heartbeat_interval =
        std::min(options.heartbeat_interval,
                 std::max(std::chrono::milliseconds(1), *env.heartbeat_timeout / 4));
  }
  return options;
}

join_request make_join_request(const rendezvous_env& env, config_summary config, bytes blob) {
  join_request r;
  r.address = env.master_addr;
  r.port = env.master_port;
  r.job_token = env.job_token;
  r.rank = env.rank;
  r.world_size = env.world_size;
  r.config = std::move(config);
  r.blob = std::move(blob);
  return r;
}

} // namespace dsa::net
