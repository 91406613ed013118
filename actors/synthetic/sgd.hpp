// A synthetic optimizer for runtime tests: plain SGD on fp32 master copies,
// p -= lr * c * g / accumulation (g summed over the step's micro-batches), where
// c clips the global gradient norm: c = min(1, clip / |g|) when clip > 0, with
// |g| over every stage (the reducers' totals), so a pipeline matches one loop.
#pragma once

#include <condition_variable>
#include <mutex>
#include <optional>
#include <utility>
#include "actors/compute.hpp"

namespace dsa::actors {

class sgd : public optimizer_compute {
public:
  sgd(double lr, std::uint32_t accumulation, double clip = 0.0)
      : lr_(lr), accumulation_(accumulation), clip_(clip) {}

  void init(const std::vector<tensor>& initial) override;
  std::vector<tensor> gradient_buffers() override { return grads_; }
  bool update(std::uint32_t step, const grad_totals& totals, std::vector<tensor>& out) override;

  const std::vector<tensor>& master() const { return master_; }

  // Streaming (optimizer_compute::stream_elements), without clipping: each parameter is
  // updated in stream_update as soon as its gradient is final, the last first. The parts
  // seen ({step, first}, in arrival order) and the steps streamed are kept for tests.
  void set_streaming(bool on) { stream_ = on; }
  std::int64_t stream_elements() const override { return stream_ && clip_ <= 0 ? 1 : 0; }
  void gradients_final(std::uint32_t step, std::uint32_t first) override;
  bool stream_update(std::uint32_t step) override;
  void cancel() override;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> parts_seen() const;
  std::uint32_t streamed() const { return streamed_; }

private:
  double lr_;
  std::uint32_t accumulation_;
  double clip_;
  std::vector<tensor> master_;
  std::vector<tensor> grads_;
  bool stream_ = false;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> parts_;
  std::optional<std::uint32_t> streamed_step_;
  std::uint32_t streamed_ = 0;
  bool cancelled_ = false;
};

// The same rule on one tensor (the plain-loop reference uses it too); grad_scale is c.
void sgd_apply(tensor& param, const tensor& grad, double lr, std::uint32_t accumulation, double grad_scale = 1.0);
// c of the rule above for a gradient sum of squares.
double sgd_clip_factor(double clip, double sum_of_squares);

} // namespace dsa::actors
