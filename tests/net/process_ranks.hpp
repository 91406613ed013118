// Test harness for ucx_transport: one forked process per rank (net::run_forked_ranks),
// each with a ucx_transport connected to the others through the parent's address relay.
#pragma once

#include "io/net/fork_ranks.hpp"
#include "io/net/ucx_transport.hpp"

#include <cstdint>
#include <functional>
#include <vector>

namespace dsa::test {

using rank_fn = std::function<expected<net::bytes>(net::ucx_transport& t, int rank,
                                                   const std::vector<net::bytes>& addresses)>;

struct process_options {
  std::uint64_t job_token = 0x5eed0fd5ac7012ULL;
  std::vector<std::pair<std::string, std::string>> env; // set before UCX starts
  std::chrono::seconds deadline{120};
};

// Runs fn in n processes over a connected ucx_transport; every rank's outcome by rank.
// The transports close only once every rank's fn has returned.
inline std::vector<net::forked_result> run_process_ranks(int n, const rank_fn& fn,
                                                         const process_options& options = {}) {
  net::fork_options fork;
  fork.env = options.env;
  fork.deadline = options.deadline;
  const std::uint64_t token = options.job_token;
  return net::run_forked_ranks(
      n,
      [&fn, n, token](int rank, const net::exchange_fn& exchange) -> expected<net::bytes> {
        DSA_ASSIGN_OR_RETURN(auto t, net::ucx_transport::create(rank, n, token));
        DSA_ASSIGN_OR_RETURN(std::vector<net::bytes> addresses, exchange(t->local_address()));
        DSA_TRY(t->connect(addresses));
        expected<net::bytes> result = fn(*t, rank, addresses);
        // No rank closes its transport while another still runs its function (as in a
        // job's orderly shutdown); a round that fails (a rank died) does not wait.
        (void)exchange(net::bytes{});
        return result;
      },
      fork);
}

} // namespace dsa::test
