// The per-step rendezvous of a run's optimizer shards. DeepSpeed makes three
// decisions at the gradient-accumulation boundary that need every stage: the
// tied word-embedding gradient is summed across the first and last stage, the
// global gradient norm is taken over all stages (clipping), and the fp16
// overflow flag is OR-ed over all stages (skip or not). Each shard calls the
// phases below from its own worker thread; a phase returns when every shard
// has arrived. Waiting is bounded: abort() (or the deadline) makes every
// waiter throw, so a failed run never hangs here.
#pragma once

#include "core/tensor.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace dsa::train {

// What one shard contributes to the step decision.
struct step_contribution {
  double sum_of_squares = 0.0; // of its (loss-scaled) gradients, counting tied ones once
  bool overflow = false;       // inf/nan seen in its gradients
};

struct step_decision {
  bool skip = false;        // overflow: no update, no schedule step
  double scaled_norm = 0.0; // global norm of the loss-scaled gradients
  double grad_scale = 1.0;  // multiply gradients by this (1 / (loss_scale x clip))
  double loss_scale = 1.0;  // the scale this step's gradients carry
  double lr = 0.0;          // learning rate of this update
  bool set_betas = false;   // OneCycle momentum cycling
  double beta1 = 0.0, beta2 = 0.0;
  bool save_state = false;  // every shard hands its state to after_update (a checkpoint)
  // After the step, as DeepSpeed's monitor logs them: the schedule's next lr and the
  // updated loss scale.
  double lr_after = 0.0;
  double loss_scale_after = 1.0;
};

class step_sync {
public:
  // participants: the shards; tied_holders: how many of them hold the tied word
  // embedding and call exchange_tied (2 with several stages).
  step_sync(std::uint32_t participants, std::uint32_t tied_holders, std::chrono::milliseconds deadline);

  // Phase 1, called by the tied_holders only: exchanges the tied gradient (f32);
  // returns the holders' tensors in participant order, so every holder sums them
  // in the same order.
  std::vector<tensor> exchange_tied(std::uint32_t step, std::uint32_t participant, const tensor& tied_grad);

  // Phase 2: combines contributions; `decide` runs once, on the last arrival, and its
  // decision is returned to all.
  step_decision decide(std::uint32_t step, std::uint32_t participant, const step_contribution& c,
                       const std::function<step_decision(const std::vector<step_contribution>&)>& decide);

  // Phase 3 (optional): a rendezvous after the update; `last` runs once, on the last arrival
  // (checkpoint writing, metrics), after every participant has deposited its payload.
  using payload = std::map<std::string, tensor>;
  // `sum_of_squares` is the shard's gradient contribution, summed for `last` (metrics).
  void after_update(std::uint32_t step, std::uint32_t participant, payload p, double sum_of_squares,
                    const std::function<void(std::vector<payload>&, double total_sum_of_squares)>& last);

  // Wakes every waiter with an exception (the run failed elsewhere).
  void abort(const std::string& why);

private:
  struct round {
    std::uint32_t arrived = 0;
    std::uint32_t left = 0;
    std::vector<tensor> tensors;
    std::vector<step_contribution> contributions;
    std::vector<payload> payloads;
    double sum_of_squares = 0.0;
    step_decision decision;
    bool done = false;
  };
  round& round_for(std::uint32_t step, int phase);
  void wait_done(std::unique_lock<std::mutex>& lock, round& r, std::uint32_t step, int phase);
  void leave(std::uint32_t step, int phase, round& r, std::uint32_t count);

  std::uint32_t n_;
  std::uint32_t tied_holders_;
  std::chrono::milliseconds deadline_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::pair<std::uint32_t, int>, round> rounds_;
  std::string aborted_;
};

} // namespace dsa::train
