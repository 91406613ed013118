// Loss and accuracy of each step, summed over its micro-batches by the stage
// that holds the head and read once per step by the metrics writer. Thread-safe.
#pragma once

#include "models/bert/bert_batch.hpp"

#include <cstdint>
#include <map>
#include <mutex>

namespace dsa::train {

struct step_totals {
  std::int64_t micro_batches = 0;
  double loss_sum = 0.0; // sum of micro-batch total losses
  double mlm_loss_sum = 0.0, nsp_loss_sum = 0.0;
  std::int64_t mlm_count = 0, mlm_correct = 0, nsp_count = 0, nsp_correct = 0;
  std::int64_t span_count = 0, span_correct = 0; // squad: start and end together

  double mean_loss() const { return micro_batches ? loss_sum / static_cast<double>(micro_batches) : 0.0; }
};

class step_stats {
public:
  void add(std::uint32_t step, const bert::bert_losses& l);
  // Removes and returns the totals of `step`.
  step_totals take(std::uint32_t step);

private:
  std::mutex mutex_;
  std::map<std::uint32_t, step_totals> steps_;
};

} // namespace dsa::train
