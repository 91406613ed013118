// Runs one function per rank in processes forked from this one (ranks on one machine:
// the multi-process tests and `dsactor bench allreduce`). The ranks can exchange one
// blob each (a UCX worker address) through the parent, and send back a result.
//
// Fork before anything in this process initialises UCX or starts threads that hold
// locks (the children inherit only the calling thread).
#pragma once

#include "io/net/transport.hpp"

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace dsa::net {

// In a child: hands this rank's blob to the parent and returns every rank's blob, by
// rank, once every rank has called it (a barrier through the parent). Each call is one
// round; a round some rank cannot join (it died or returned) fails with an error.
using exchange_fn = std::function<expected<std::vector<bytes>>(const bytes& mine)>;
// The function each child runs; its bytes (or error) go back to the parent.
using forked_fn = std::function<expected<bytes>(int rank, const exchange_fn& exchange)>;

struct forked_result {
  bool finished = false; // the rank reported back (false: it died or passed the deadline)
  bool ok = false;       // fn returned bytes, in `output`; else its error is in `error`
                         // (or, when not finished, how the process ended)
  bytes output;
  std::string error;
};

struct fork_options {
  // Set in every child before fn runs (e.g. {"UCX_TLS", "tcp"}).
  std::vector<std::pair<std::string, std::string>> env;
  // Ranks still running this long after the start are killed: a bound, not a wait.
  std::chrono::seconds deadline{120};
};

// Forks n children running fn(rank, exchange), waits for all of them (killing those
// past the deadline) and returns their results by rank.
std::vector<forked_result> run_forked_ranks(int n, const forked_fn& fn,
                                            const fork_options& options = {});

} // namespace dsa::net
