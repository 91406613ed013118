// How a stage schedules its micro-batches: the pick order and the stash quota.
// 1F1B: backward first, S - s stash slots. GPipe: forward first, M stash slots,
// and a step's backwards wait until all its forwards ran (the flush).
#pragma once

#include <cstdint>
#include <string>

namespace dsa::actors {

enum class pick_order { backward_first, forward_first };

enum class schedule_kind { one_f_one_b, gpipe };

struct schedule_policy {
  pick_order order = pick_order::backward_first;
  std::uint32_t stash_slots = 1; // micro-batches held between forward and backward

  static schedule_policy one_f_one_b(std::uint32_t stages, std::uint32_t stage) {
    return {pick_order::backward_first, stages - stage};
  }
  static schedule_policy gpipe(std::uint32_t micro_batches) {
    return {pick_order::forward_first, micro_batches};
  }
  static schedule_policy make(schedule_kind kind, std::uint32_t stages, std::uint32_t stage,
                              std::uint32_t micro_batches) {
    return kind == schedule_kind::gpipe ? gpipe(micro_batches) : one_f_one_b(stages, stage);
  }
};

} // namespace dsa::actors
