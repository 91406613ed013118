// 1-bit Adam, 0/1 Adam and 1-bit LAMB (optimizer.type OneBitAdam, ZeroOneAdam, OneBitLamb)
// inside one stage's optimizer shard (train::compressed_whole_shard, ZeRO stage 0, any number of
// pipeline stages). As DeepSpeed's FP16_Optimizer does, each parameter group (BERT's
// "decay" and "no_decay") is one flat f32 master buffer with one flat gradient buffer, one
// optimizer (optim/onebit_adam.hpp, zeroone_adam.hpp) and one pair of 1-bit error buffers;
// 1-bit LAMB (onebit_lamb.hpp) has one group, optim::onebit_lamb_group, holding both (decay
// first), as DeepSpeed's OnebitLamb exchanges all its momentum at once. The reducer's
// gradient buffers are views of the flat gradients.
//
// Which steps exchange what: while a step's optimizer wants averaged gradients the reducer
// sums them over the ranks as for Adam; otherwise (local_next()) the reducer leaves them on
// their rank, and the shard exchanges compressed state itself with
// net::compressed_allreduce on its own communicator (the stage's shard channel). The reducer
// sums gradients already scaled by 1 / ranks (the loss gradient's scale), so a local step
// first multiplies them by the rank count: each rank's optimizer sees its own mean gradient.
// A local step's overflow is OR-reduced over the ranks (every rank skips together), and its
// clipping norm is each rank's own (DeepSpeed's behaviour on local gradients).
#pragma once

#include "actors/compute.hpp"
#include "actors/train/shard/onebit_channel.hpp"
#include "io/net/communicator.hpp"
#include "io/net/comms_logger.hpp"
#include "models/bert/parameter_specs.hpp"
#include "optim/onebit_adam.hpp"
#include "optim/onebit_lamb.hpp"
#include "optim/optimizer.hpp"
#include "optim/zeroone_adam.hpp"

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <variant>
#include <vector>

namespace dsa::train {

struct compressed_shard_options {
  optim::optimizer_config optimizer; // a compressed type
  std::vector<bert::param_spec> specs;
  // The same stage's shards on the other ranks (their own channel); null on one rank.
  std::shared_ptr<net::communicator> peers;
  net::comms_logger* logger = nullptr;
  std::string caller; // "shard S of rank R", for the logger and errors
  // Rows of bert.embeddings.position_embeddings.weight from this one on never get a
  // gradient (the data's sequences are shorter): their momentum is masked to zero after
  // every exchange (DeepSpeed's exp_avg_mask for BERT), since 1-bit signs cannot carry a
  // zero. -1: no mask.
  std::int64_t mask_positions_from = -1;
};

class compressed_shard {
public:
  // initial: the stage's f32 weights in specs order (copied into the flat masters).
  compressed_shard(compressed_shard_options options, const std::vector<tensor>& initial);

  // Views of the flat buffers, one per parameter in stage order.
  const std::vector<tensor>& params() const { return params_; }
  const std::vector<tensor>& grads() const { return grads_; }

  // Whether the next step's gradients stay on each rank (the reducer leaves them alone).
  // Changes only in step(); safe to read from any thread.
  bool local_next() const { return local_next_.load(std::memory_order_acquire); }

  // A local step's totals as the step decider should see them: the sums of squares of
  // the rank's own mean gradient, and not finite on every rank when any rank's are not.
  // A collective on a local step (every rank's shard calls it for the same steps).
  actors::grad_totals local_totals(const actors::grad_totals& totals);

  // One step with the gradients multiplied by grad_scale (unscale and clip) at lr, and with
  // new betas when `betas` holds them (a momentum schedule).
  status step(double lr, double grad_scale, std::optional<std::pair<double, double>> betas = std::nullopt);

  std::int64_t step_count() const;
  const compressed_traffic& traffic() const { return channel_.traffic(); }
  // The checkpoint form: "<name>.exp_avg" and "<name>.exp_avg_sq" per parameter (as Adam's),
  // and each group's extra arrays as "compressed.<group>.<field>" (copies).
  std::map<std::string, tensor> state_tensors() const;
  // Restores that form at step count `step` (the error buffers start at zero, as in
  // DeepSpeed). Extra arrays are needed where the optimizer has them (1-bit LAMB).
  status load_state(const std::map<std::string, tensor>& tensors, std::int64_t step);

  // The 1-bit error buffers, "<group>.worker" and "<group>.server" (copies; absent before
  // a group's first exchange), and "exchanges" (an i64 count of this run's exchanges before the save: informational,
  // and it keeps the file non-empty before any exchange; not restored, each run's
  // communication report counts its own), for this rank's own file.
  std::map<std::string, tensor> error_tensors() const;
  // Restores them (a checkpoint of a run on the same number of ranks); a size that does not
  // fit is an error naming the tensor.
  status load_errors(const std::map<std::string, tensor>& tensors);

private:
  using any_optimizer = std::variant<optim::onebit_adam, optim::zeroone_adam, optim::onebit_lamb>;
  struct group {
    std::string name;
    std::vector<std::size_t> members; // parameter indices, in stage order
    std::vector<std::int64_t> offsets;
    tensor master, grad;              // flat f32
    std::optional<any_optimizer> opt;
  };
  bool wants_local(const group& g) const;
  // local_next_ from every group's optimizer (after its state changed).
  void refresh_local_next();

  compressed_shard_options options_;
  std::vector<group> groups_;
  std::vector<tensor> params_, grads_;
  std::atomic<bool> local_next_{false};
  onebit_channel channel_;
};

} // namespace dsa::train
