// How a stage schedules its micro-batches: the pick order and the stash quota.
// 1F1B: backward first, S - s stash slots. GPipe: forward first, M stash slots,
// and a step's backwards wait until all its forwards ran (the flush).
// Zero-bubble (the zero-bubble papers' B/W split): each backward is cut into B, the input
// gradient the previous stage waits for, and W, the weight gradients only the optimizer
// needs. B runs as 1F1B's backward does; W runs when no F or B can, in micro-batch order,
// and the step's last W publishes its gradients. A stage runs at most 1F1B's S - s
// forwards ahead of their B and holds at most max_stashed micro-batches between a forward
// and its W (activation memory: S, 1F1B's first stage, gives ZB-H1; 2S - 1 gives ZB-H2);
// as many as the stash holds may wait for their W, or at most max_deferred_w when set.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace dsa::actors {

enum class pick_order { backward_first, forward_first };

enum class schedule_kind { one_f_one_b, gpipe, zero_bubble };

struct schedule_policy {
  pick_order order = pick_order::backward_first;
  std::uint32_t stash_slots = 1; // micro-batches held between forward and backward (and W)
  bool split_backward = false;   // zero-bubble: backward = B, then W later
  std::uint32_t max_deferred_w = 0;
  std::uint32_t forward_ahead = 0; // forwards whose backward has not run (0: only the stash bounds them)

  static schedule_policy one_f_one_b(std::uint32_t stages, std::uint32_t stage) {
    return {pick_order::backward_first, stages - stage};
  }
  static schedule_policy gpipe(std::uint32_t micro_batches) {
    return {pick_order::forward_first, micro_batches};
  }
  // max_stashed: 0 means S (1F1B's activation memory); below S - s it is raised to it.
  // max_deferred_w: 0 means only the stash bounds the deferred W (a B never waits for a W
  // while the stash holds it: with messages in flight that keeps B, which the previous
  // stage waits for, off the W's path).
  static schedule_policy zero_bubble(std::uint32_t stages, std::uint32_t stage, std::uint32_t max_stashed,
                                     std::uint32_t max_deferred_w = 0) {
    const std::uint32_t ahead = stages - stage;
    const std::uint32_t held = std::max(max_stashed == 0 ? stages : max_stashed, ahead);
    const std::uint32_t deferred = max_deferred_w > 0 ? std::min(held, max_deferred_w) : held;
    schedule_policy p{pick_order::backward_first, std::min(held, ahead + deferred), true, deferred};
    p.forward_ahead = ahead;
    return p;
  }
  static schedule_policy make(schedule_kind kind, std::uint32_t stages, std::uint32_t stage,
                              std::uint32_t micro_batches, std::uint32_t max_stashed = 0,
                              std::uint32_t max_deferred_w = 0) {
    switch (kind) {
      case schedule_kind::gpipe: return gpipe(micro_batches);
      case schedule_kind::zero_bubble: return zero_bubble(stages, stage, max_stashed, max_deferred_w);
      case schedule_kind::one_f_one_b: break;
    }
    return one_f_one_b(stages, stage);
  }
};

} // namespace dsa::actors
