// The reducer's state machine; see reducer_state.hpp.
#include "actors/reducer_state.hpp"

namespace dsa::actors {

// A message or job result that breaks the protocol: the reducer actor fails, naming it.
#define DSA_REDUCER_EXPECT(cond, ...)                                  \
  do {                                                                 \
    if (!(cond)) return make_error(errc::protocol, __VA_ARGS__);        \
  } while (0)

using kind = reducer_action::kind;

reducer_state::reducer_state(std::uint32_t index, std::uint32_t stages, tied_role role, grad_scope scope,
                             bool speculate)
    : index_(index), stages_(stages), role_(role), scope_(scope),
      speculate_(speculate && scope == grad_scope::global && stages > 1) {
  DSA_CHECK(index < stages, "reducer {} of {} stages", index, stages);
  DSA_CHECK(role == tied_role::none || (stages > 1 && (role == tied_role::owner) == (index == 0) &&
                                        (role == tied_role::copy) == (index + 1 == stages)),
            "reducer {}: a tied parameter is owned by the first and copied by the last of several stages", index);
}

reducer_state::result reducer_state::on_grads(std::uint32_t step) {
  DSA_REDUCER_EXPECT(!waiting_grads_ && !(step_ && *step_ == step), "reducer {}: gradients of step {} arrived twice", index_,
            step);
  waiting_grads_ = step;
  return advance();
}

reducer_state::result reducer_state::on_gathered(std::uint32_t step, double share) {
  DSA_REDUCER_EXPECT(step_ && *step_ == step && !gathered_, "reducer {}: gather of step {} ended unasked", index_, step);
  gathered_ = true;
  share_ = share;
  return advance();
}

reducer_state::result reducer_state::on_tied_arrived(std::uint32_t step) {
  DSA_REDUCER_EXPECT(role_ != tied_role::none && !tied_arrived_, "reducer {}: tied gradient of step {} unexpected", index_,
            step);
  DSA_REDUCER_EXPECT(role_ == tied_role::owner || (step_ && *step_ == step && tied_up_sent_),
            "reducer {}: the tied sum of step {} arrived before its gradient was offered", index_, step);
  tied_arrived_ = step;
  return advance();
}

reducer_state::result reducer_state::on_tied_done(std::uint32_t step, double tied_share) {
  DSA_REDUCER_EXPECT(step_ && *step_ == step && tied_started_ && !tied_done_, "reducer {}: tied job of step {} ended unasked",
            index_, step);
  tied_done_ = true;
  if (role_ == tied_role::owner) share_ += tied_share;
  return advance();
}

reducer_state::result reducer_state::on_tied_down_released() {
  DSA_REDUCER_EXPECT(role_ == tied_role::owner && !tied_down_free_, "reducer {}: tied sum released unasked", index_);
  tied_down_free_ = true;
  return advance();
}

reducer_state::result reducer_state::on_partial(std::uint32_t stage, std::uint32_t step, double share) {
  DSA_REDUCER_EXPECT(scope_ == grad_scope::global && stage < stages_ && stage != index_,
            "reducer {}: share of stage {} unexpected", index_, stage);
  auto& row = shares_[step];
  row.resize(stages_);
  DSA_REDUCER_EXPECT(!row[stage], "reducer {}: share of stage {} for step {} arrived twice", index_, stage, step);
  row[stage] = share;
  return advance();
}

reducer_state::result reducer_state::on_reduced_released() {
  DSA_REDUCER_EXPECT(!buffers_free_, "reducer {}: buffers released while free", index_);
  buffers_free_ = true;
  return advance();
}

reducer_state::actions reducer_state::advance() {
  actions out;
  if (!step_ && waiting_grads_ && buffers_free_) {
    step_ = *waiting_grads_;
    waiting_grads_.reset();
    buffers_free_ = false;
    out.push_back({kind::gather, *step_});
  }
  if (!step_ || !gathered_) return out;
  const std::uint32_t k = *step_;
  const bool tied_here = tied_arrived_ && *tied_arrived_ == k;
  if (role_ == tied_role::copy && !tied_up_sent_) {
    tied_up_sent_ = true;
    out.push_back({kind::send_tied_up, k});
  }
  if (role_ != tied_role::none && tied_here && !tied_started_) {
    tied_started_ = true;
    tied_arrived_.reset();
    out.push_back({role_ == tied_role::owner ? kind::tied_sum : kind::tied_copy, k});
  }
  // The owner's share is final once the tied sum is counted; the others' at once.
  if (!published_ && (role_ != tied_role::owner || tied_done_)) {
    published_ = true;
    auto& row = shares_[k];
    row.resize(stages_);
    row[index_] = share_;
    if (scope_ == grad_scope::global && stages_ > 1) out.push_back({kind::publish, k, 0, share_});
    if (role_ == tied_role::owner) {
      tied_down_free_ = false;
      out.push_back({kind::send_tied_down, k});
    }
  }
  if (!published_) return out;
  if (role_ == tied_role::owner && !tied_down_free_) return out; // the copy still reads the sum
  if (role_ == tied_role::copy && !tied_done_) return out;
  // The buffers are final: sent on every speculated step, whether or not the shares are
  // all in yet, so the shards of every rank speculate on the same steps.
  if (speculate_ && !early_sent_) {
    early_sent_ = true;
    out.push_back({kind::early, k, 0, share_});
  }
  double total = share_;
  if (scope_ == grad_scope::global) {
    const auto& row = shares_[k];
    total = 0;
    for (const auto& s : row) {
      if (!s) return out;
      total += *s; // stage order: the same sum on every reducer
    }
  }
  shares_.erase(k);
  out.push_back({kind::forward, k, total, share_});
  step_.reset();
  gathered_ = tied_started_ = tied_done_ = tied_up_sent_ = published_ = early_sent_ = false;
  share_ = 0;
  return out;
}

} // namespace dsa::actors

#undef DSA_REDUCER_EXPECT
