// DeepSpeed's comms_logger for dsactor's collectives: every profiled operation's
// latency and message size, as a line per call (verbose) and as a summary per
// operation and message size at the end of the run. Bandwidths follow nccl-tests
// (its PERFORMANCE.md), in GB/s, with S the bytes of one rank's buffer for
// allreduce and broadcast, and the whole gathered or scattered buffer (ranks x the
// per-rank part) for allgather and reduce_scatter:
//   algbw = S / t
//   busbw = algbw x 2(n-1)/n (allreduce), x (n-1)/n (allgather, reduce_scatter,
//           all_to_all), x 1 (broadcast, barrier)
// so busbw compares with the link's speed whatever the rank count. (DeepSpeed's own
// logger prints Gbit/s and counts allreduce's algbw twice; the numbers here are
// nccl-tests'.)
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsa::net {

// The config section `comms_logger` (DeepSpeed's keys and defaults).
struct comms_logger_options {
  bool enabled = false;
  bool verbose = false;  // a log line per call
  bool prof_all = true;  // profile every operation; else only those in prof_ops
  bool debug = false;    // name the caller in verbose lines and in the summary
  std::vector<std::string> prof_ops; // DeepSpeed's names: all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, barrier
};

// The operation names the logger knows (DeepSpeed's).
const std::vector<std::string>& comms_logger_ops();

// The bus bandwidth factor of nccl-tests for `op` on `ranks` ranks (see above).
double busbw_factor(std::string_view op, int ranks);

// Thread-safe: the reducers' and coordinators' threads record into one logger.
class comms_logger {
public:
  comms_logger(comms_logger_options options, int ranks);

  bool enabled() const { return options_.enabled; }
  // Whether calls of `op` are recorded (enabled, and prof_all or listed in prof_ops).
  bool profiles(std::string_view op) const;
  // One call of `op` that moved `bytes` (S above) in `seconds`; `caller` names who
  // issued it (e.g. "reducer 2"). Logs a line when verbose.
  void record(std::string_view op, std::int64_t bytes, double seconds, std::string_view caller);

  struct row {
    std::string op;
    std::int64_t bytes = 0; // message size
    std::int64_t count = 0;
    double total_s = 0;
    double algbw_GBps = 0, busbw_GBps = 0; // means over the calls
    std::string callers;                   // with debug: who issued them
  };
  // Per operation and message size, in name and size order.
  std::vector<row> rows() const;
  // The summary table as text (one line per row, a header first); "" when nothing was recorded.
  std::string summary() const;

private:
  struct totals {
    std::int64_t count = 0;
    double total_s = 0, algbw_sum = 0, busbw_sum = 0;
    std::map<std::string, std::int64_t> callers;
  };
  comms_logger_options options_;
  int ranks_;
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, std::int64_t>, totals> totals_;
};

} // namespace dsa::net
