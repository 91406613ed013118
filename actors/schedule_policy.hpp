// How a stage schedules its micro-batches: the pick order and the stash quota.
// 1F1B: backward first, S - s stash slots. GPipe: forward first, M stash slots,
// and a step's backwards wait until all its forwards ran (the flush).
// Zero-bubble (the zero-bubble papers' B/W split): each backward is cut into B, the input
// gradient the previous stage waits for, and W, the weight gradients only the optimizer
// needs. B runs as 1F1B's backward does; W runs when no F or B can, in micro-batch order,
// and the step's last W publishes its gradients. A stage holds at most max_deferred_w
// micro-batches whose B ran and W did not (their stash: inputs and output gradients), on
// top of 1F1B's S - s: the bound on the extra memory.
#pragma once

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

  static schedule_policy one_f_one_b(std::uint32_t stages, std::uint32_t stage) {
    return {pick_order::backward_first, stages - stage};
  }
  static schedule_policy gpipe(std::uint32_t micro_batches) {
    return {pick_order::forward_first, micro_batches};
  }
  // max_deferred_w >= 1.
  static schedule_policy zero_bubble(std::uint32_t stages, std::uint32_t stage, std::uint32_t max_deferred_w) {
    return {pick_order::backward_first, stages - stage + max_deferred_w, true, max_deferred_w};
  }
  static schedule_policy make(schedule_kind kind, std::uint32_t stages, std::uint32_t stage,
                              std::uint32_t micro_batches, std::uint32_t max_deferred_w = 1) {
    switch (kind) {
      case schedule_kind::gpipe: return gpipe(micro_batches);
      case schedule_kind::zero_bubble: return zero_bubble(stages, stage, max_deferred_w);
      case schedule_kind::one_f_one_b: break;
    }
    return one_f_one_b(stages, stage);
  }
};

} // namespace dsa::actors
