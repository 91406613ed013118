// What a stage's gradient reducer does next, without CAF: a plain state
// machine the reducer actor feeds with events (a message arrived, a job ended)
// and whose returned actions it carries out. Tested on its own. An event that
// breaks the protocol (a duplicate, an unexpected job result) returns an error
// (errc::protocol); the actor then fails, naming it.
//
// Per step k the reducer of stage s
//   1. gathers the stage's accumulated gradients into its optimizer shard's f32
//      buffers (summed over the data-parallel ranks, if several) and takes their
//      sum of squares (its share; a tied copy excluded);
//   2. with a tied parameter between the first and the last stage: the copy
//      (last stage) offers its tied gradient to the owner (first stage), the
//      owner adds it to its own, counts the sum in its share and offers the sum
//      back, the copy overwrites its gradient with it (reduce, then broadcast);
//   3. with global totals: sends its share to every other reducer and waits for
//      theirs (an all-reduce by message; every reducer adds the shares in stage
//      order, so all shards see the same total bit for bit);
//   4. forwards the reduced gradients and the totals to its shard.
// With speculation (global totals, several stages) it tells the shard as soon as
// its own stage's gradients are final in the buffers (after 1 and 2, with the
// copy done reading the tied sum), before the other stages' shares are in, so the
// shard can start an update that assumes no clipping and no overflow (early).
// The shard gives the buffers back (released) after its update; gradients of
// step k + 1 that arrive earlier wait for that.
#pragma once

#include "actors/plan.hpp"
#include "core/error.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace dsa::actors {

enum class tied_role : std::uint8_t {
  none,  // no tied parameter, or nobody to exchange it with (counted as any other)
  owner, // the first stage: sums, counts the tied gradient, sends the sum back
  copy,  // the last stage: sends its tied gradient, receives the sum, does not count it
};

struct reducer_action {
  enum class kind : std::uint8_t {
    gather,         // start the gather job of `step`
    tied_sum,       // owner: start adding the copy's tied gradient into its own
    tied_copy,      // copy: start overwriting its tied gradient with the owner's sum
    send_tied_up,   // copy: offer its tied gradient of `step` to the owner
    send_tied_down, // owner: offer the sum of `step` to the copy
    publish,        // send `own` (this stage's share of `step`) to every other reducer
    forward,        // hand the step's gradients to the shard with `total` and `own`
    early,          // speculation: the buffers of `step` are final, `own` known, the total not yet
  };
  kind what = kind::gather;
  std::uint32_t step = 0;
  double total = 0;
  double own = 0;
};

class reducer_state {
public:
  using actions = std::vector<reducer_action>;
  using result = expected<actions>;

  // A role that does not fit the position (the owner is stage 0, the copy the last
  // of several) is a broken invariant.
  // speculate: emit `early` before `forward` of every step (global totals and several
  // stages only; otherwise the total is known as soon as the own share is).
  reducer_state(std::uint32_t index, std::uint32_t stages, tied_role role, grad_scope scope, bool speculate = false);

  // The stage's accumulated gradients of `step` arrived.
  result on_grads(std::uint32_t step);
  // The gather job of `step` ended; `share`: the sum of squares of every gradient
  // but the tied one (owner and copy) or of all (no tied role).
  result on_gathered(std::uint32_t step, double share);
  // Owner: the copy's tied gradient of `step` arrived. Copy: the owner's sum arrived.
  result on_tied_arrived(std::uint32_t step);
  // Owner: the sum job ended, `tied_share` is the sum of squares of the sum.
  // Copy: the copy job ended (tied_share 0).
  result on_tied_done(std::uint32_t step, double tied_share);
  // Owner: the copy is done reading the sum.
  result on_tied_down_released();
  // Another reducer's share of `step`.
  result on_partial(std::uint32_t stage, std::uint32_t step, double share);
  // The shard is done with the buffers (its update ended).
  result on_reduced_released();

  tied_role role() const { return role_; }
  // Whether the shard's buffers may be written: no step is being reduced and the shard
  // gave them back after its last update (a streamed step's parts check this first).
  bool buffers_free() const { return buffers_free_ && !step_; }
  std::optional<std::uint32_t> current_step() const { return step_; }

private:
  actions advance();

  std::uint32_t index_, stages_;
  tied_role role_;
  grad_scope scope_;
  bool speculate_ = false;
  bool early_sent_ = false;
  bool buffers_free_ = true;
  std::optional<std::uint32_t> waiting_grads_; // arrived while the shard still held the buffers
  std::optional<std::uint32_t> step_;          // the step being reduced
  bool gathered_ = false;
  double share_ = 0;
  std::optional<std::uint32_t> tied_arrived_;
  bool tied_started_ = false, tied_done_ = false, tied_up_sent_ = false;
  bool tied_down_free_ = true;
  bool published_ = false;
  std::map<std::uint32_t, std::vector<std::optional<double>>> shares_; // step -> [stage]
};

} // namespace dsa::actors
