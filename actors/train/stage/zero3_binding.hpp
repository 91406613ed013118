// ZeRO-3 (and ZeRO-2 on one pipeline stage): which of a stage's tensors are bound while the
// model runs each part of its range, shared by the CPU stage (its bert_parameters) and the
// GPU stage (its part's device arrays), which differ only in how they bind.
//
// The model tells the binding (a bert::part_gate) just before and just after it runs each
// part (the embeddings, a layer, the head), forward then backward. On enter the binding
// binds what the parameter fetcher hands out for that use (the part's gathered weights,
// on a step's first use the persistent ones too) and, in the backward, a zeroed gradient
// for each of the part's tensors that has none yet; on leave it unbinds what the fetcher
// frees and hands the gradients that are final for the micro-batch (after the last part of
// the backward that adds to them: the tied word embedding after the embeddings) to the
// binder, which passes them to the gradient partition. Without a fetcher (ZeRO-2) the
// values stay bound and only gradients come and go.
//
// One compute thread calls everything.
#pragma once

#include "actors/train/stage/param_fetcher.hpp"
#include "core/tensor.hpp"
#include "models/bert/bert_parameters.hpp"
#include "models/bert/bert_part.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace dsa::train {

// Where a stage binds (the CPU's host tensors, a GPU part's device arrays).
class zero3_binder {
public:
  virtual ~zero3_binder() = default;
  virtual void bind_values(std::vector<std::pair<std::size_t, tensor>> values) = 0;
  virtual void unbind_values(const std::vector<std::size_t>& indices) = 0;
  // Zeroed gradients for these tensors (none of them has one).
  virtual void bind_gradients(const std::vector<std::size_t>& indices) = 0;
  // The micro-batch's final gradients of these tensors (of backward `step`): to the
  // partition, then unbound.
  virtual void hand_over(const std::vector<std::size_t>& indices, std::uint32_t step) = 0;
};

// The parts of `params`' range in the forward's order, each with the tensors it reads
// (bert::parameters_read_by: for the pre-training head the tied word embedding too), and
// the fetcher's sequence of uses for one micro-batch: the forward's parts, then in reverse.
std::vector<fetch_part> zero3_parts(const bert::bert_parameters& params);
std::vector<std::int64_t> zero3_sequence(const std::vector<fetch_part>& parts);
// ZeRO-3: the stage's whole weights (`whole`, layout order) to the fetcher, which takes its
// partition; the stage's own values are dropped (the fetcher's between steps).
void hand_weights_to(param_fetcher& fetcher, bert::bert_parameters& params, const std::vector<tensor>& whole);
// After the run: every tensor gathered whole (every rank, the same point) back into the
// stage's values.
void take_weights_back(param_fetcher& fetcher, bert::bert_parameters& params);

// A tensor's bytes in a ZeRO-3 device binder's host buffers (upload and gradient staging):
// each tensor starts 64-byte aligned.
constexpr std::size_t zero3_padded(std::size_t bytes) { return (bytes + 63) / 64 * 64; }

// The bytes one use's gathered tensors take in a device binder's upload buffer: the
// persistent tensors (a step's first use binds them too) and the largest part's others,
// `elem_size` bytes an element, each tensor padded to 64 bytes. numel and persistent: per
// tensor of the stage.
std::size_t zero3_upload_bytes(const std::vector<fetch_part>& parts, const std::vector<std::int64_t>& numel,
                               const std::vector<bool>& persistent, std::size_t elem_size);

// A device's window of bound parts: at most `parts` parts' weights on it at once, the part
// computing and those bound ahead of it. The part entered k-th binds its weights only after
// the part entered (k - parts)-th has left (its weights freed in the device's order): a
// device binder records each part's end in a slot and makes its copies wait for a slot.
// enter() gives the slot to wait for (none while fewer than `parts` parts have left),
// leave() the slot to record the part's end in; they alternate.
class bind_window {
public:
  explicit bind_window(std::size_t parts);
  std::size_t parts() const { return slots_; }
  std::optional<std::size_t> enter();
  std::size_t leave();

private:
  std::size_t slots_;
  std::uint64_t entered_ = 0, left_ = 0;
};

class zero3_binding final : public bert::part_gate {
public:
  // fetcher: null with ZeRO-2 (the values stay bound); tensors: the stage's count.
  zero3_binding(const std::vector<fetch_part>& parts, std::size_t tensors, param_fetcher* fetcher,
                zero3_binder& binder);

  // Before the model runs a forward (backward false) or a backward of `step`.
  void begin(std::uint32_t step, bool backward) {
    step_ = step;
    backward_ = backward;
  }
  void enter(std::int64_t part) override;
  void leave(std::int64_t part) override;

  std::size_t gradients_bound() const;

private:
  param_fetcher* fetcher_;
  zero3_binder& binder_;
  std::map<std::int64_t, std::vector<std::size_t>> tensors_;      // part id -> its tensors
  std::map<std::int64_t, std::vector<std::size_t>> final_after_;  // part id -> gradients final after its backward
  std::vector<bool> grad_bound_;
  std::uint32_t step_ = 0;
  bool backward_ = false;
};

} // namespace dsa::train
