// Per-step loss and accuracy as forward metrics and back.
#include "actors/train/stage/step_stats.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dsa::train {

namespace {

// The positions in the metrics vector.
enum metric : std::size_t {
  micro_batches,
  loss,
  mlm_loss,
  nsp_loss,
  mlm_count,
  mlm_correct,
  nsp_count,
  nsp_correct,
  span_count,
  span_correct,
  metric_count
};

} // namespace

std::vector<double> forward_metrics_of(const bert::bert_losses& l) {
  std::vector<double> m(metric_count, 0.0);
  m[micro_batches] = 1;
  m[loss] = l.total;
  m[mlm_loss] = l.mlm_loss;
  m[nsp_loss] = l.nsp_loss;
  m[mlm_count] = static_cast<double>(l.mlm_count);
  m[mlm_correct] = static_cast<double>(l.mlm_correct);
  m[nsp_count] = static_cast<double>(l.nsp_count);
  m[nsp_correct] = static_cast<double>(l.nsp_correct);
  m[span_count] = static_cast<double>(l.start_count + l.end_count);
  m[span_correct] = static_cast<double>(l.start_correct + l.end_correct);
  return m;
}

step_totals step_totals_of(const std::vector<double>& summed) {
  step_totals t;
  if (summed.empty()) return t;
  // The sums arrive by message (step_report): a wrong length fails the step hook, and so the run, by name.
  if (summed.size() != metric_count)
    throw std::runtime_error(fmt::format("step metrics of {} values, expected {}", summed.size(),
                                         static_cast<std::size_t>(metric_count)));
  auto count = [&](metric i) { return static_cast<std::int64_t>(summed[i]); };
  t.micro_batches = count(micro_batches);
  t.loss_sum = summed[loss];
  t.mlm_loss_sum = summed[mlm_loss];
  t.nsp_loss_sum = summed[nsp_loss];
  t.mlm_count = count(mlm_count);
  t.mlm_correct = count(mlm_correct);
  t.nsp_count = count(nsp_count);
  t.nsp_correct = count(nsp_correct);
  t.span_count = count(span_count);
  t.span_correct = count(span_correct);
  return t;
}

} // namespace dsa::train
