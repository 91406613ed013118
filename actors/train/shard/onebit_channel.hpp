// One stage shard's 1-bit exchanges with the same stage's shards on the other ranks:
// net::compressed_allreduce on the shard's channel with one pair of error buffers per
// parameter group (the optimizer shard's state, saved in each rank's own checkpoint file),
// the comms logger's record of each exchange, and the bytes counted. Shared by the whole
// shard (compressed_shard) and the ZeRO partition (partition_shard with 1-bit Adam).
#pragma once

#include "actors/compute.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "io/net/communicator.hpp"
#include "io/net/comms_logger.hpp"
#include "io/net/compressed_allreduce.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dsa::train {

// A 1-D f32 tensor's values, and the reverse (copies): the checkpoint form of the buffers.
std::vector<float> f32_values(const tensor& t);
tensor f32_tensor(const std::vector<float>& v);

// What a plain fp16 ring allreduce of `elements` sends from each of `ranks` ranks:
// 2 (n - 1) / n x 2 bytes per element (0 on one rank).
inline double fp16_ring_allreduce_bytes(double elements, int ranks) {
  return ranks > 1 ? 2.0 * (ranks - 1) / ranks * 2.0 * elements : 0.0;
}

// What the shard's exchanges sent from this rank, and what a plain fp16 ring allreduce of
// the same gradients (2 (n - 1) / n x 2 bytes per element per step) would have sent.
struct compressed_traffic {
  std::int64_t steps = 0, local_steps = 0, exchanges = 0;
  std::uint64_t payload_bytes = 0; // packed signs and scales
  std::uint64_t wire_bytes = 0;    // the transport's count during the exchanges
  std::uint64_t fp16_bytes = 0;    // over all steps
  std::uint64_t local_fp16_bytes = 0; // over the local steps only
};

class onebit_channel {
public:
  // peers: null or one rank means no exchange (the average is the value).
  onebit_channel(std::shared_ptr<net::communicator> peers, net::comms_logger* logger, std::string caller)
      : peers_(std::move(peers)), logger_(logger), caller_(std::move(caller)) {}

  int ranks() const { return peers_ ? peers_->size() : 1; }
  const std::shared_ptr<net::communicator>& peers() const { return peers_; }
  const std::string& caller() const { return caller_; }

  // Replaces values (count) with their compressed average, with `group`'s error buffers
  // (reset to zero first when reset_errors).
  status exchange(const std::string& group, float* values, std::int64_t count, bool reset_errors = false);

  // A local step's totals as the step decider should see them: the sums of squares of the
  // rank's own mean gradient (the reducer's sums of gradients scaled by 1 / ranks, times
  // ranks squared), and not finite on every rank when any rank's are not. A collective on a
  // local step (every rank's shard calls it for the same steps).
  actors::grad_totals local_totals(const actors::grad_totals& totals);

  // A step's accounting: `elements` gradient values, local or averaged. The exchanges since
  // the last call count as the compressed phase's only on a local step (not, e.g., the
  // dummy first step's, whose gradients were averaged).
  void count_step(std::int64_t elements, bool local);
  const compressed_traffic& traffic() const { return traffic_; }

  // The error buffers, "<group>.worker" and "<group>.server" (copies; absent before a
  // group's first exchange), and "exchanges" (an i64 count of this run's exchanges before the save: informational,
  // and it keeps the file non-empty before any exchange; not restored, each run's
  // communication report counts its own), for this rank's own file.
  std::map<std::string, tensor> error_tensors() const;
  // Restores them for the groups of `group_numel` (a checkpoint of a run on the same number
  // of ranks); a size that does not fit is an error naming the tensor.
  status load_errors(const std::map<std::string, tensor>& tensors, const std::map<std::string, std::int64_t>& group_numel);
  // Every group's buffers back to zero (a checkpoint load without its error files).
  void reset_errors() { errors_.clear(); }

private:
  std::shared_ptr<net::communicator> peers_;
  net::comms_logger* logger_;
  std::string caller_;
  std::map<std::string, net::onebit_errors> errors_;
  compressed_traffic traffic_;
  compressed_traffic pending_; // this step's exchanges, until count_step
};

} // namespace dsa::train
