// A shard holding its whole stage under optim::optimizer; see whole_shard.hpp.
#include "actors/train/shard/whole_shard.hpp"

#include "optim/grad_clip.hpp"

#include <fmt/format.h>

#include <chrono>
#include <stdexcept>

namespace dsa::train {
std::vector<tensor> slot_shard::gradient_buffers() {
  std::vector<tensor> out;
  for (const auto& s : slots_) out.push_back(s.grad);
  return out;
}

void slot_shard::set_slots(const std::vector<tensor>& masters, const std::vector<tensor>& grads) {
  const dtype half = working_dtype(options_.working);
  slots_.clear();
  for (std::size_t i = 0; i < masters.size(); ++i) {
    optim::param_slot s;
    s.name = options_.specs[i].name;
    s.param = masters[i];
    s.grad = grads[i];
    if (half != dtype::f32) s.half_copy = cast_to(s.param, half);
    slots_.push_back(s);
  }
}

void slot_shard::refresh_halves() {
  for (auto& s : slots_)
    if (s.half_copy.defined()) cast_into(s.half_copy, s.param, s.half_copy.type());
}

void slot_shard::publish(const step_decision&, std::vector<tensor>& out) {
  out.resize(slots_.size());
  version_bytes_ = 0;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    const tensor& src = slots_[i].half_copy.defined() ? slots_[i].half_copy : slots_[i].param;
    if (!out[i].defined() || out[i].type() != src.type() || out[i].shape() != src.shape())
      out[i] = tensor::empty(src.shape(), src.type());
    out[i].copy_from(src);
    version_bytes_ += static_cast<std::int64_t>(out[i].nbytes());
  }
}

state_payload slot_shard::slot_payload(std::map<std::string, tensor> state, std::int64_t step) const {
  state_payload p;
  for (const auto& s : slots_) p["master." + s.name] = s.param; // views: no copy of the shard's state
  for (auto& [name, t] : state) p[name] = std::move(t);
  tensor count = tensor::empty({1}, dtype::i64);
  count.data<std::int64_t>()[0] = step;
  p["optimizer_step_count"] = count;
  return p;
}

shard_bytes slot_shard::slot_bytes() const {
  shard_bytes b;
  for (const auto& s : slots_) {
    b.gradients += static_cast<std::int64_t>(s.grad.nbytes());
    b.masters += static_cast<std::int64_t>(s.param.nbytes());
    if (s.half_copy.defined()) b.half_masters += static_cast<std::int64_t>(s.half_copy.nbytes());
  }
  b.version = version_bytes_;
  return b;
}

void whole_shard::init(const std::vector<tensor>& initial) {
  std::vector<tensor> masters, grads;
  for (const tensor& t : starting_masters(initial)) {
    masters.push_back(cast_to(t, dtype::f32));
    grads.push_back(tensor::zeros(masters.back().shape(), dtype::f32));
  }
  set_slots(masters, grads);
  // Groups hold copies of the slots: tensors are shared, so updates land in slots_ too.
  auto groups = optim::bert_param_groups(slots_, options_.optimizer.weight_decay, options_.optimizer.lr);
  auto created = optim::optimizer::create(options_.optimizer, std::move(groups));
  if (!created) throw std::runtime_error(created.err().message);
  opt_.emplace(std::move(*created));
  if (options_.resume_state) {
    auto loaded = opt_->load_state(*options_.resume_state);
    if (!loaded) throw std::runtime_error(loaded.err().message);
  }
  if (stream_elements() > 0) stream_ = std::make_unique<host_stream>(options_.participant, slots_.size());
}

std::int64_t whole_shard::stream_elements() const {
  const auto type = options_.optimizer.type;
  const bool adam = type == optim::optimizer_type::adam || type == optim::optimizer_type::adamw;
  // stream_bucket is set where the run streams (run_config::streams_host_update: the one
  // statement of which runs do, which the plans and the log read too). With clipping or loss
  // scaling the update needs the step's totals first: a stream needs a copy of the state to
  // take back, which a model bigger than the GPU may not spare in host memory; only when
  // asked (speculative_stream, run_config::speculative_host_stream), else those steps update
  // after the backward.
  if (options_.stream_bucket <= 0 || !adam || options_.exchanges_tied) return 0;
  if (options_.decider->needs_totals() && !options_.speculative_stream) return 0;
  return options_.stream_bucket;
}

void whole_shard::gradients_final(std::uint32_t step, std::uint32_t first) {
  DSA_CHECK(stream_ != nullptr, "optimizer shard {}: gradients of step {} it does not stream", options_.participant,
            step);
  stream_->gradients_final(step, first);
}

void whole_shard::cancel() {
  if (stream_) stream_->cancel();
}

bool whole_shard::stream_update(std::uint32_t step) {
  DSA_CHECK(stream_ && !speculation_pending(), "optimizer shard {}: a streamed update of step {} it cannot stream",
            options_.participant, step);
  const auto started = std::chrono::steady_clock::now();
  const step_decision assumed = options_.decider->assume();
  const bool speculative = options_.decider->needs_totals();
  DSA_CHECK(!assumed.skip && (speculative || assumed.grad_scale == 1.0),
            "optimizer shard {}: a streamed update of step {} assumes no skip, and no gradient scale unless it "
            "speculates",
            options_.participant, step);
  if (speculative && last_differed_) { // likely to differ again: this step waits for the totals
    ++declined_;
    return false;
  }
  optim::optimizer_state live;
  if (speculative) {
    backup_.params.resize(slots_.size());
    backup_.grads.resize(slots_.size());
    backup_.halves.resize(slots_.size());
    backup_.moments.step = opt_->step_count();
    backup_.beta1 = opt_->settings().beta1;
    backup_.beta2 = opt_->settings().beta2;
    live = opt_->state_views();
  }
  opt_->set_lr(assumed.lr);
  if (assumed.set_betas) opt_->set_betas(assumed.beta1, assumed.beta2);
  opt_->begin_step();
  // Each parameter as soon as its gradient is final (the reducer's parts, last first).
  const auto after_backward = stream_->run(step, started, [&](std::size_t i) {
    if (speculative) {
      back_up_slot(i, live);
      optim::scale_in_place(slots_[i].grad, assumed.grad_scale); // the loss scale's unscaling
    }
    if (auto s = opt_->step_param(slots_[i].name); !s)
      throw std::runtime_error(fmt::format("optimizer shard {}: {}", options_.participant, s.err().message));
  });
  streamed_with_ = assumed;
  streamed_speculative_ = speculative;
  if (speculative) ++speculative_streams_;
  add_update_time(after_backward); // wall_clock_breakdown: what the update added after the backward
  return true;
}

bool whole_shard::settle_streamed(std::uint32_t step, const step_decision& would, const step_decision& d) {
  last_differed_ = !step_decider::same_update(would, d);
  if (!stream_ || !stream_->take(step)) return false;
  if (step_decider::same_update(streamed_with_, d)) return true;
  if (streamed_speculative_) { // clipped or overflowed: as if the stream had not run, then the update (or the skip)
    roll_back();
    ++redone_;
    return false;
  }
  // Without clipping or loss scaling the decision is the assumed one whatever the totals.
  throw std::runtime_error(fmt::format("optimizer shard {}: step {} was streamed with lr {}, but its decision is lr "
                                       "{}, gradient scale {}{}",
                                       options_.participant, step, streamed_with_.lr, d.lr, d.grad_scale,
                                       d.skip ? ", skipped" : ""));
}

void whole_shard::back_up_slot(std::size_t i, const optim::optimizer_state& live) {
  backup& b = backup_;
  keep_copy(b.params[i], slots_[i].param);
  keep_copy(b.grads[i], slots_[i].grad);
  keep_copy(b.halves[i], slots_[i].half_copy);
  for (const char* field : {".exp_avg", ".exp_avg_sq"}) {
    const std::string name = slots_[i].name + field;
    keep_copy(b.moments.tensors[name], live.tensors.at(name));
  }
}

std::string whole_shard::swap_report() const {
  if (!stream_) return {};
  std::string line = stream_->report();
  if (!line.empty() && (redone_ > 0 || declined_ > 0))
    line += fmt::format("; {} streamed updates taken back (a clip: redone after the backward; an overflow: skipped), "
                        "{} steps waited for the totals after one",
                        redone_, declined_);
  return line;
}

void whole_shard::advance(std::uint32_t, const step_decision& d) {
  if (d.skip) return;
  for (auto& s : slots_) optim::scale_in_place(s.grad, d.grad_scale);
  opt_->set_lr(d.lr);
  if (d.set_betas) opt_->set_betas(d.beta1, d.beta2);
  opt_->step();
}

void whole_shard::back_up() {
  backup& b = backup_;
  b.params.resize(slots_.size());
  b.grads.resize(slots_.size());
  b.halves.resize(slots_.size());
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    keep_copy(b.params[i], slots_[i].param);
    keep_copy(b.grads[i], slots_[i].grad);
    keep_copy(b.halves[i], slots_[i].half_copy);
  }
  const optim::optimizer_state live = opt_->state_views();
  for (const auto& [name, t] : live.tensors) keep_copy(b.moments.tensors[name], t);
  b.moments.step = live.step;
  b.beta1 = opt_->settings().beta1;
  b.beta2 = opt_->settings().beta2;
}

void whole_shard::roll_back() {
  const backup& b = backup_;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].param.copy_from(b.params[i]);
    slots_[i].grad.copy_from(b.grads[i]);
    if (b.halves[i].defined()) slots_[i].half_copy.copy_from(b.halves[i]);
  }
  if (auto s = opt_->load_state(b.moments); !s)
    throw std::runtime_error(fmt::format("rolling back stage {}'s speculative update: {}", options_.participant,
                                         s.err().message));
  opt_->set_betas(b.beta1, b.beta2);
}

state_payload whole_shard::payload() const {
  optim::optimizer_state st = opt_->state_views();
  return slot_payload(std::move(st.tensors), st.step);
}

shard_bytes whole_shard::held_bytes() const {
  shard_bytes b = slot_bytes();
  // The moments live in the optimizer's own slots (it allocates them); none before init.
  if (opt_)
    for (const auto& g : opt_->groups())
      for (const auto& s : g.params) b.moments += static_cast<std::int64_t>(s.m.nbytes() + s.v.nbytes());
  return b;
}

} // namespace dsa::train
