// Loss and accuracy of each step: the stage holding the head reports each
// micro-batch's as forward metrics (stage_compute::forward_metrics), the
// runtime sums them over the step and hands the sums to the step hooks by
// message (step_summary::metrics), and the metrics writer reads them back.
#pragma once

#include "models/bert/bert_batch.hpp"

#include <cstdint>
#include <vector>

namespace dsa::train {

struct step_totals {
  std::int64_t micro_batches = 0;
  double loss_sum = 0.0; // sum of micro-batch total losses
  double mlm_loss_sum = 0.0, nsp_loss_sum = 0.0;
  std::int64_t mlm_count = 0, mlm_correct = 0, nsp_count = 0, nsp_correct = 0;
  std::int64_t span_count = 0, span_correct = 0; // squad: start and end together

  double mean_loss() const { return micro_batches ? loss_sum / static_cast<double>(micro_batches) : 0.0; }
};

// One micro-batch's losses as forward metrics: a vector whose element-wise sum
// over a step's micro-batches step_totals_of reads back (counts stay exact: a
// double holds every integer up to 2^53).
std::vector<double> forward_metrics_of(const bert::bert_losses& l);
// The totals of a step from its summed forward metrics; all zero when `summed`
// is empty (no head on the last stage reported any); throws when it has another length.
step_totals step_totals_of(const std::vector<double>& summed);

} // namespace dsa::train
