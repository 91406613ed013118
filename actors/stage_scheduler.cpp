// The local pick rule of a pipeline stage: load > backward > forward
// (1F1B) or load > forward > backward (GPipe), lowest micro-batch first; with a split
// backward (zero-bubble) load > B > F > W.
#include "actors/stage_scheduler.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <fmt/format.h>

namespace dsa::actors {

namespace {

std::vector<std::uint32_t> slot_list(std::uint32_t count) {
  std::vector<std::uint32_t> slots;
  for (std::uint32_t i = count; i > 0; --i) slots.push_back(i - 1); // lowest at the back
  return slots;
}

std::uint32_t take_lowest(std::vector<std::uint32_t>& slots) {
  std::uint32_t slot = slots.back();
  slots.pop_back();
  return slot;
}

status give_back(std::vector<std::uint32_t>& slots, std::uint32_t slot, std::uint32_t capacity, const char* what) {
  if (slot >= capacity || std::find(slots.begin(), slots.end(), slot) != slots.end())
    return make_error(errc::protocol, "{} slot {} released twice or out of range (the edge has {})", what, slot,
                      capacity);
  slots.push_back(slot);
  std::sort(slots.begin(), slots.end(), std::greater<std::uint32_t>());
  return {};
}

} // namespace

const char* work_kind_name(work_kind kind) {
  switch (kind) {
    case work_kind::forward: return "forward";
    case work_kind::backward: return "backward";
    case work_kind::load: return "load";
    case work_kind::weight: return "weight";
  }
  return "?";
}

stage_scheduler::stage_scheduler(stage_position pos, schedule_policy policy, stage_credits credits)
    : pos_(pos), policy_(policy), credits_(credits), free_stash_(slot_list(policy.stash_slots)),
      free_out_(slot_list(pos.last() ? 0 : credits.out_slots)),
      free_grad_out_(slot_list(pos.first() ? 0 : credits.grad_out_slots)), held_version_(pos.first_step),
      next_forward_step_(pos.first_step), next_backward_step_(pos.first_step) {
  DSA_CHECK(pos.stages > 0 && pos.index < pos.stages && pos.micro_batches > 0,
            "bad stage position {}/{} with {} micro-batches", pos.index, pos.stages, pos.micro_batches);
  DSA_CHECK(policy.stash_slots > 0, "a stage needs at least one stash slot");
  DSA_CHECK(!policy.split_backward || policy.max_deferred_w > 0, "a split backward needs max_deferred_w >= 1");
}

status stage_scheduler::check_next(std::uint32_t& count, std::uint32_t step, std::uint32_t micro_batch,
                                   const char* edge) const {
  const std::uint32_t M = pos_.micro_batches;
  if (count >= pos_.steps * M)
    return make_error(errc::protocol, "stage {}: {} ({}, {}) after the run's last micro-batch", pos_.index, edge,
                      step, micro_batch);
  const std::uint32_t want_step = pos_.first_step + count / M, want_mb = count % M;
  if (step != want_step || micro_batch != want_mb)
    return make_error(errc::protocol, "stage {}: {} ({}, {}) arrived, expected ({}, {})", pos_.index, edge, step,
                      micro_batch, want_step, want_mb);
  ++count;
  return {};
}

status stage_scheduler::on_input(std::uint32_t step, std::uint32_t micro_batch, std::uint32_t slot) {
  DSA_TRY(check_next(inputs_seen_, step, micro_batch, "input"));
  inputs_.push_back({step, micro_batch, slot});
  return {};
}

status stage_scheduler::on_labels(std::uint32_t step, std::uint32_t micro_batch, std::uint32_t slot) {
  if (!pos_.last())
    return make_error(errc::protocol, "labels sent to stage {}, which is not the last", pos_.index);
  DSA_TRY(check_next(labels_seen_, step, micro_batch, "labels"));
  labels_.push_back({step, micro_batch, slot});
  return {};
}

status stage_scheduler::on_grad(std::uint32_t step, std::uint32_t micro_batch, std::uint32_t slot) {
  if (pos_.last()) return make_error(errc::protocol, "output gradient sent to the last stage {}", pos_.index);
  if (grads_seen_ >= forwards_done_)
    return make_error(errc::protocol, "stage {}: gradient ({}, {}) arrived before its forward ran", pos_.index,
                      step, micro_batch);
  DSA_TRY(check_next(grads_seen_, step, micro_batch, "gradient"));
  grads_.push_back({step, micro_batch, slot});
  return {};
}

status stage_scheduler::on_version(std::uint32_t step, std::uint32_t slot) {
  const std::uint32_t expected = pending_version_ ? pending_version_->step + 1 : held_version_ + 1;
  if (pending_version_ || step != held_version_ + 1 || step > pos_.end_step())
    return make_error(errc::protocol, "stage {}: parameter version {} arrived, expected {} (holding {}, run ends at {})",
                      pos_.index, step, expected, held_version_, pos_.end_step());
  pending_version_ = arrival{step, 0, slot};
  return {};
}

status stage_scheduler::on_out_released(std::uint32_t slot) {
  return give_back(free_out_, slot, pos_.last() ? 0 : credits_.out_slots, "activation");
}

status stage_scheduler::on_grad_out_released(std::uint32_t slot) {
  return give_back(free_grad_out_, slot, pos_.first() ? 0 : credits_.grad_out_slots, "gradient");
}

status stage_scheduler::on_grads_released() {
  if (grads_outstanding_ == 0)
    return make_error(errc::protocol, "stage {}: gradients released that were not published", pos_.index);
  --grads_outstanding_;
  return {};
}

std::optional<stage_work> stage_scheduler::pick() {
  if (busy_) return std::nullopt;
  std::optional<stage_work> work;
  if (pending_version_ && grads_outstanding_ == 0) {
    work = stage_work{};
    work->kind = work_kind::load;
    work->step = pending_version_->step;
    work->in_slot = pending_version_->slot;
    pending_version_.reset();
  } else if (pending_version_) {
    // The load waits for the reducer to give the gradients back; nothing else runs first.
  } else if (policy_.order == pick_order::backward_first) {
    work = pick_backward();
    if (!work) work = pick_forward();
    if (!work && policy_.split_backward) work = pick_weight();
  } else {
    work = pick_forward();
    if (!work) work = pick_backward();
  }
  busy_ = work.has_value();
  return work;
}

std::optional<stage_work> stage_scheduler::pick_forward() {
  if (next_forward_step_ >= pos_.end_step() || held_version_ < next_forward_step_) return std::nullopt;
  if (inputs_.empty() || free_stash_.empty()) return std::nullopt;
  if (policy_.forward_ahead > 0 && in_flight_.size() >= policy_.forward_ahead) return std::nullopt;
  if (!pos_.last() && free_out_.empty()) return std::nullopt;
  if (pos_.last() && labels_.empty()) return std::nullopt;
  const arrival in = inputs_.front();
  DSA_CHECK(in.step == next_forward_step_ && in.micro_batch == next_forward_mb_,
            "stage {} expected input ({}, {}), got ({}, {})", pos_.index, next_forward_step_,
            next_forward_mb_, in.step, in.micro_batch);
  stage_work w;
  w.kind = work_kind::forward;
  w.step = in.step;
  w.micro_batch = in.micro_batch;
  w.in_slot = in.slot;
  inputs_.pop_front();
  if (pos_.last()) {
    const arrival lb = labels_.front();
    DSA_CHECK(lb.step == in.step && lb.micro_batch == in.micro_batch, "labels ({}, {}) for input ({}, {})",
              lb.step, lb.micro_batch, in.step, in.micro_batch);
    w.labels_slot = lb.slot;
    labels_.pop_front();
  } else {
    w.out_slot = take_lowest(free_out_);
  }
  w.stash_slot = take_lowest(free_stash_);
  if (++next_forward_mb_ == pos_.micro_batches) {
    next_forward_mb_ = 0;
    ++next_forward_step_;
  }
  return w;
}

std::optional<stage_work> stage_scheduler::pick_backward() {
  if (in_flight_.empty() || grads_outstanding_ > 0) return std::nullopt;
  if (policy_.split_backward && deferred_.size() >= policy_.max_deferred_w) return std::nullopt; // a W first
  const stashed s = in_flight_.front();
  // GPipe flushes: a step's backwards start once all its forwards ran.
  if (policy_.order == pick_order::forward_first && next_forward_step_ <= s.step) return std::nullopt;
  if (!pos_.first() && free_grad_out_.empty()) return std::nullopt;
  stage_work w;
  w.kind = work_kind::backward;
  w.step = s.step;
  w.micro_batch = s.micro_batch;
  w.stash_slot = s.stash_slot;
  // With a split backward the step's last W publishes, not its last B.
  w.last_of_step = !policy_.split_backward && s.micro_batch + 1 == pos_.micro_batches;
  if (!pos_.last()) {
    if (grads_.empty()) return std::nullopt;
    const arrival g = grads_.front();
    DSA_CHECK(g.step == s.step && g.micro_batch == s.micro_batch,
              "stage {} got gradient ({}, {}) while ({}, {}) is the oldest in flight", pos_.index, g.step,
              g.micro_batch, s.step, s.micro_batch);
    w.in_slot = g.slot;
    grads_.pop_front();
  }
  if (!pos_.first()) w.out_slot = take_lowest(free_grad_out_);
  in_flight_.pop_front();
  if (w.last_of_step) grads_outstanding_ = std::max<std::uint32_t>(credits_.grads_slots, 1);
  return w;
}

// W of the oldest micro-batch whose B ran (micro-batch order keeps the accumulation's
// order that of 1F1B); the step's last W publishes its gradients.
std::optional<stage_work> stage_scheduler::pick_weight() {
  if (deferred_.empty() || grads_outstanding_ > 0) return std::nullopt;
  const stashed s = deferred_.front();
  deferred_.pop_front();
  stage_work w;
  w.kind = work_kind::weight;
  w.step = s.step;
  w.micro_batch = s.micro_batch;
  w.stash_slot = s.stash_slot;
  w.last_of_step = s.micro_batch + 1 == pos_.micro_batches;
  if (w.last_of_step) grads_outstanding_ = std::max<std::uint32_t>(credits_.grads_slots, 1);
  return w;
}

void stage_scheduler::on_done(const stage_work& work) {
  DSA_CHECK(busy_, "on_done without running work");
  busy_ = false;
  switch (work.kind) {
    case work_kind::forward:
      in_flight_.push_back({work.step, work.micro_batch, work.stash_slot});
      ++forwards_done_;
      break;
    case work_kind::backward:
      if (policy_.split_backward) { // the stash stays until W
        deferred_.push_back({work.step, work.micro_batch, work.stash_slot});
        break;
      }
      [[fallthrough]];
    case work_kind::weight: {
      const bool stash_ok = give_back(free_stash_, work.stash_slot, policy_.stash_slots, "stash").has_value();
      DSA_CHECK(stash_ok, "stage {}: stash slot {} was not in use", pos_.index, work.stash_slot);
      if (work.last_of_step) next_backward_step_ = work.step + 1;
      break;
    }
    case work_kind::load:
      held_version_ = work.step;
      break;
  }
}

std::string stage_scheduler::describe() const {
  return fmt::format("stage {}: busy={} version={} next_forward=({}, {}) in_flight={} deferred_w={} inputs={} "
                     "labels={} grads={} free_stash={} free_out={} free_grad_out={} pending_version={} "
                     "grads_outstanding={}",
                     pos_.index, busy_, held_version_, next_forward_step_, next_forward_mb_,
                     in_flight_.size(), deferred_.size(), inputs_.size(), labels_.size(), grads_.size(), free_stash_.size(),
                     free_out_.size(), free_grad_out_.size(), pending_version_.has_value(), grads_outstanding_);
}

} // namespace dsa::actors
