// A ZeRO stage's bindings around each part the model runs; see zero3_binding.hpp.
#include "actors/train/stage/zero3_binding.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace dsa::train {

std::vector<fetch_part> zero3_parts(const bert::bert_parameters& params) {
  std::vector<fetch_part> out;
  const auto& r = params.range();
  auto part = [&](std::int64_t id) { return fetch_part{id, bert::parameters_read_by(params, id)}; };
  if (r.has_embeddings()) out.push_back(part(bert::backward_options::embeddings_done));
  for (std::int64_t l = r.first_layer; l < r.last_layer; ++l) out.push_back(part(l));
  if (r.has_head()) out.push_back(part(bert::backward_options::head_done));
  return out;
}

std::vector<std::int64_t> zero3_sequence(const std::vector<fetch_part>& parts) {
  std::vector<std::int64_t> out;
  for (const auto& p : parts) out.push_back(p.id);
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) out.push_back(it->id);
  return out;
}

namespace {
std::vector<std::pair<std::size_t, tensor>> indexed(std::vector<tensor> values) {
  std::vector<std::pair<std::size_t, tensor>> out;
  for (std::size_t i = 0; i < values.size(); ++i) out.emplace_back(i, std::move(values[i]));
  return out;
}
} // namespace

void hand_weights_to(param_fetcher& fetcher, bert::bert_parameters& params, const std::vector<tensor>& whole) {
  fetcher.take_whole(whole);
  params.set_values(indexed(std::vector<tensor>(params.entries().size())));
}

void take_weights_back(param_fetcher& fetcher, bert::bert_parameters& params) {
  params.set_values(indexed(fetcher.gather_all()));
}

std::size_t zero3_upload_bytes(const std::vector<fetch_part>& parts, const std::vector<std::int64_t>& numel,
                               const std::vector<bool>& persistent, std::size_t elem_size) {
  if (numel.size() != persistent.size())
    throw std::runtime_error(fmt::format("ZeRO binding: {} tensor sizes for {} persistence flags", numel.size(),
                                         persistent.size()));
  auto padded = [&](std::size_t t) { return zero3_padded(static_cast<std::size_t>(numel[t]) * elem_size); };
  std::size_t kept = 0, largest = 0;
  for (std::size_t t = 0; t < numel.size(); ++t)
    if (persistent[t]) kept += padded(t);
  for (const auto& p : parts) {
    std::size_t bytes = 0;
    for (std::size_t t : p.tensors) {
      if (t >= numel.size())
        throw std::runtime_error(fmt::format("ZeRO binding: part {} names tensor {} of a stage of {}", p.id, t,
                                             numel.size()));
      if (!persistent[t]) bytes += padded(t);
    }
    largest = std::max(largest, bytes);
  }
  return kept + largest;
}

bind_window::bind_window(std::size_t parts) : slots_(parts) {
  if (parts == 0) throw std::runtime_error("ZeRO binding: a device window of no parts");
}

std::optional<std::size_t> bind_window::enter() {
  if (entered_ != left_) throw std::runtime_error("ZeRO binding: a part entered before the previous one left");
  const std::uint64_t k = entered_++;
  if (k < slots_) return std::nullopt;
  return static_cast<std::size_t>((k - slots_) % slots_);
}

std::size_t bind_window::leave() {
  if (left_ + 1 != entered_) throw std::runtime_error("ZeRO binding: a part left that did not enter");
  return static_cast<std::size_t>(left_++ % slots_);
}

zero3_binding::zero3_binding(const std::vector<fetch_part>& parts, std::size_t tensors, param_fetcher* fetcher,
                             zero3_binder& binder)
    : fetcher_(fetcher), binder_(binder), grad_bound_(tensors, false) {
  // A gradient is final for the micro-batch after the last part of the backward (which runs
  // the parts in reverse) that holds it.
  std::map<std::size_t, std::int64_t> last;
  for (const auto& p : parts) {
    for (std::size_t t : p.tensors)
      if (t >= tensors)
        throw std::runtime_error(fmt::format("ZeRO binding: part {} names tensor {} of a stage of {}", p.id, t, tensors));
    tensors_[p.id] = p.tensors;
  }
  for (auto it = parts.rbegin(); it != parts.rend(); ++it)
    for (std::size_t t : it->tensors) last[t] = it->id;
  for (const auto& [t, id] : last) final_after_[id].push_back(t);
}

void zero3_binding::enter(std::int64_t part) {
  const auto it = tensors_.find(part);
  if (it == tensors_.end())
    throw std::runtime_error(fmt::format("ZeRO binding: the model entered part {}, which the stage does not have", part));
  if (fetcher_) binder_.bind_values(fetcher_->acquire(part, step_));
  if (!backward_) return;
  std::vector<std::size_t> fresh; // the part's gradients, from zero, for this micro-batch
  for (std::size_t t : it->second)
    if (!grad_bound_[t]) {
      fresh.push_back(t);
      grad_bound_[t] = true;
    }
  if (!fresh.empty()) binder_.bind_gradients(fresh);
}

void zero3_binding::leave(std::int64_t part) {
  if (fetcher_) binder_.unbind_values(fetcher_->release(part));
  if (!backward_) return;
  const auto final = final_after_.find(part);
  if (final == final_after_.end()) return;
  for (std::size_t t : final->second) grad_bound_[t] = false;
  binder_.hand_over(final->second, step_);
}

std::size_t zero3_binding::gradients_bound() const {
  return static_cast<std::size_t>(std::count(grad_bound_.begin(), grad_bound_.end(), true));
}

} // namespace dsa::train
