// Per-step loss and accuracy accumulation.
#include "actors/train/step_stats.hpp"

namespace dsa::train {

void step_stats::add(std::uint32_t step, const bert::bert_losses& l) {
  std::lock_guard<std::mutex> lock(mutex_);
  step_totals& t = steps_[step];
  ++t.micro_batches;
  t.loss_sum += l.total;
  t.mlm_loss_sum += l.mlm_loss;
  t.nsp_loss_sum += l.nsp_loss;
  t.mlm_count += l.mlm_count;
  t.mlm_correct += l.mlm_correct;
  t.nsp_count += l.nsp_count;
  t.nsp_correct += l.nsp_correct;
  t.span_count += l.start_count + l.end_count;
  t.span_correct += l.start_correct + l.end_correct;
}

step_totals step_stats::take(std::uint32_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = steps_.find(step);
  if (it == steps_.end()) return {};
  step_totals t = it->second;
  steps_.erase(it);
  return t;
}

} // namespace dsa::train
