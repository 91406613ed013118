// Test harness for ucx_transport: runs one function per rank, each in its own forked
// process (forked before any UCX initialisation), exchanging worker addresses through
// pipes with the parent, and brings every rank's output back to the parent.
#pragma once

#include "io/net/ucx_transport.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dsa::test {

// What one rank's function returns: bytes for the parent to check, or an error.
using rank_fn = std::function<expected<net::bytes>(net::ucx_transport& t, int rank,
                                                   const std::vector<net::bytes>& addresses)>;

struct rank_outcome {
  bool finished = false;    // the process reported back (false: it died or timed out)
  bool ok = false;          // the function returned bytes (else `error` holds its error)
  net::bytes output;
  std::string error;
};

struct process_options {
  std::uint64_t job_token = 0x5eed0fd5ac7012ULL;
  // Set in every rank before UCX starts (e.g. {"UCX_TLS", "tcp"}).
  std::vector<std::pair<std::string, std::string>> env;
  // Every rank is killed when the whole run takes longer: a bound, not a wait.
  std::chrono::seconds deadline{120};
};

// Runs fn in n processes; returns each rank's outcome once all have exited (or were
// killed at the deadline). A rank that dies reports finished = false.
std::vector<rank_outcome> run_process_ranks(int n, const rank_fn& fn,
                                            const process_options& options = {});

} // namespace dsa::test
