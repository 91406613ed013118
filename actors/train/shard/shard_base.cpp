// What every mode of optimizer shard shares; see shard_base.hpp.
#include "actors/train/shard/shard_base.hpp"

#include "core/log.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dsa::train {

// dst = a copy of src, reusing dst's storage when it fits.
void keep_copy(tensor& dst, const tensor& src) {
  if (!src.defined()) {
    dst = tensor();
    return;
  }
  if (!dst.defined() || dst.type() != src.type() || dst.shape() != src.shape()) dst = tensor::empty(src.shape(), src.type());
  dst.copy_from(src);
}

void speculation::begin(std::uint32_t step, const step_decision& assumed) {
  step_ = step;
  assumed_ = assumed;
  ++speculated_;
}

speculation::outcome speculation::settle(std::uint32_t participant, std::uint32_t step, const step_decision& d) {
  outcome o;
  o.speculated = step_ && *step_ == step;
  DSA_CHECK(!step_ || o.speculated, "optimizer shard {}: update of step {} after speculating on step {}", participant,
            step, *step_);
  step_.reset();
  o.kept = o.speculated && step_decider::same_update(assumed_, d);
  if (o.speculated && !o.kept) ++rolled_back_;
  return o;
}

shard_base::shard_base(shard_options options) : options_(std::move(options)) {
  DSA_CHECK(options_.decider != nullptr, "optimizer shard {}: no step decider", options_.participant);
}

std::string shard_base::shard_name() const {
  return fmt::format("shard {} of rank {}", options_.participant, options_.zero_rank);
}

void shard_base::add_update_time(std::chrono::steady_clock::time_point since) const {
  if (options_.update_ns)
    *options_.update_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since).count();
}

bool shard_base::update(std::uint32_t step, const actors::grad_totals& totals, std::vector<tensor>& out) {
  const auto started = std::chrono::steady_clock::now();
  if (options_.fail_step >= 0 && step == static_cast<std::uint64_t>(options_.fail_step))
    throw std::runtime_error("injected fault (debug.fail_optimizer_step)");
  const step_decision would = options_.decider->assume(); // what a stream of the step assumes
  // A compressed optimizer's local step: the rank's own norms, an overflow anywhere skips everywhere.
  const step_decision d = options_.decider->decide(step, local_next() ? local_totals(totals) : totals);
  const speculation::outcome spec = speculation_.settle(options_.participant, step, d);
  const bool stream_kept = settle_streamed(step, would, d);
  if (spec.speculated && !spec.kept) roll_back(); // clipped or overflowed: as if the speculation had not run
  if (spec.kept) keep_speculated();
  if (!spec.kept && !stream_kept) advance(step, d);
  publish(d, out);
  out.push_back(loss_scale_tensor(d.loss_scale_after)); // the next step's, for the stage's backward
  last_ = d;
  add_update_time(started);
  return !d.skip;
}

bool shard_base::speculate(std::uint32_t step) {
  if (!can_speculate()) return false;
  const auto started = std::chrono::steady_clock::now();
  const step_decision assumed = options_.decider->assume();
  back_up();
  advance(step, assumed);
  speculation_.begin(step, assumed);
  add_update_time(started);
  return true;
}

state_payload shard_base::gathered_masters() const {
  DSA_CHECK(false, "optimizer shard {}: gathered_masters of a shard that checkpoints whole (payload)",
            options_.participant);
  return {};
}

ckpt::checkpoint_file shard_base::stage_masters(const std::string&, std::uint64_t) const {
  DSA_CHECK(false, "optimizer shard {}: stage_masters without a swapped state on one rank", options_.participant);
  return {};
}

std::vector<ckpt::checkpoint_file> shard_base::stage_partition(const std::string&, std::uint64_t) const {
  DSA_CHECK(false, "optimizer shard {}: stage_partition of a shard that checkpoints whole (payload)",
            options_.participant);
  return {};
}

std::vector<ckpt::checkpoint_file> shard_base::stage_errors(const std::string&, std::uint64_t) const {
  DSA_CHECK(false, "optimizer shard {}: stage_errors without a compressed optimizer over several ranks",
            options_.participant);
  return {};
}

std::vector<tensor> shard_base::starting_masters(const std::vector<tensor>& initial) const {
  const auto& specs = options_.specs;
  DSA_CHECK(initial.size() == specs.size(), "optimizer shard {}: {} initial tensors for {} parameters",
            options_.participant, initial.size(), specs.size());
  if (options_.resume_masters.empty()) return initial;
  std::vector<tensor> start(specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    auto resumed = options_.resume_masters.find(specs[i].name);
    if (resumed == options_.resume_masters.end())
      throw std::runtime_error("checkpoint has no master weights for " + specs[i].name);
    start[i] = resumed->second;
  }
  return start;
}

} // namespace dsa::train
