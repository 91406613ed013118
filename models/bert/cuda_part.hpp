// A contiguous slice of BERT (post-LN or pre-LN) on one GPU, as a pipeline stage runs it: optional
// embeddings, encoder layers [first, last) (cuda_layer.hpp), optional head: pre-training
// (MLM + NSP) or SQuAD's span head (start/end logits, squad_head.hpp's twin). bert_part's twin: the same arithmetic, the same dropout streams and the same
// tied-embedding rule (a range with the embeddings adds the lookup's gradient to the word
// embedding, a range with the head the decoder's; one range holding both gets the sum).
// Each micro-batch in flight has its own device stash, filled by forward and emptied by
// backward.
//
// The parameters live on the device, one per entry of the range's bert_parameters and in
// its order: an f32 master, a working copy in the storage type for the matrices and tables
// the products and lookups read, and an f32 gradient accumulated (+=) over micro-batches.
// Activations and their gradients are of the storage type; the heads' logits and losses f32.
// Everything is enqueued on the part's stream: only losses() and the downloads wait for it.
// One call at a time (the caller's worker thread, with the part's device current).
#pragma once

#include "core/pinned_memory.hpp"
#include "kernels/cpu/adam.hpp"
#include "kernels/cuda/gemm.hpp"
#include "models/bert/bert_batch.hpp"
#include "models/bert/bert_part.hpp"
#include "models/bert/bert_dropout.hpp"
#include "models/bert/bert_parameters.hpp"
#include "models/bert/cuda_layer.hpp"
#include "models/bert/squad_head.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

namespace dsa::bert::gpu {

// Page-locked host memory (cudaMallocHost through core/pinned_memory.hpp's owner, which
// counts it and falls back to pageable memory when pinning fails), so a copy from the
// device is asynchronous. Kept for the stash's life: freeing it waits for the device.
class pinned_buffer {
public:
  pinned_buffer() = default;
  ~pinned_buffer();
  pinned_buffer(pinned_buffer&& other) noexcept;
  pinned_buffer& operator=(pinned_buffer&& other) noexcept;
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  // At least `bytes`, reallocated (contents lost) only when it grows; `what` names the
  // purpose in the owner's warning when it cannot be pinned.
  void reserve(std::size_t bytes, std::string_view what = "a device readout buffer");
  void* get() const { return block_.ptr; }
  bool pinned() const { return block_.pinned; }

private:
  pinned_block block_;
};

// The head's losses and accuracy counts of one forward, copied to the host as the forward
// ends (an event marks the copies); losses() waits for that event only.
// Pre-training: per-row MLM losses and hits, then per-sequence NSP losses and hits.
// SQuAD: the start then the end logits (span_rows * seq f32 each), then with labels the
// per-sequence start losses, end losses (f32), start hits, end hits (int32).
struct loss_readout {
  pinned_buffer host;
  cudaEvent_t copied = nullptr;
  struct layout {
    std::int64_t mlm_count = 0, nsp_rows = 0, nsp_count = 0;
    bool squad = false, span_labels = false;
    std::int64_t span_rows = 0, span_seq = 0, start_count = 0, end_count = 0;
  } at;
  bool valid = false; // the last forward into the stash enqueued these copies
  loss_readout() = default;
  ~loss_readout();
  loss_readout(loss_readout&& other) noexcept;
  loss_readout& operator=(loss_readout&& other) noexcept;
};

// What one micro-batch's forward keeps for its backward, on the device.
struct part_stash {
  loss_readout readout; // survives the backward (reused by the next forward into the stash)
  std::int64_t batch = 0, seq = 0;
  forward_context ctx; // the dropout streams' seed, step and micro-batch, for the backward
  device_array ids, types, key_mask;
  // Deterministic mode with the embeddings: the rows of each word id (pad id left out), of
  // each position and of each token type, in row order (ordered_row_scatter_add's keys,
  // offsets and order), for the tables' gradients.
  struct row_groups {
    device_array keys, offsets, order;
    std::int64_t count = 0;
  } word_rows, position_rows, type_rows;
  // acts[0]: the embeddings' output, or the previous stage's output; acts[k + 1]: layer k's.
  std::vector<device_array> acts;
  // Pre-LN with the head: the final LayerNorm's output (the head's input) and statistics.
  device_array final_normed, final_mean, final_rstd;
  device_array emb_sum, emb_mean, emb_rstd;
  std::vector<layer_stash> layers; // empty between forward and backward with checkpoint_activations
  // The head: the MLM rows picked as the CPU head picks them, their transform, and the
  // logits, which the cross entropy overwrote with the (scaled) loss gradient.
  std::int64_t mlm_count = 0, nsp_count = 0;
  bool nsp = false;
  device_array mlm_rows, mlm_labels, masked, transform, gelu, normed, norm_mean, norm_rstd, logits;
  device_array mlm_loss, mlm_correct;
  device_array cls_rows, nsp_labels, cls, pre, pooled, nsp_logits, nsp_loss, nsp_correct;
  // The SQuAD head: logits (2, rows), the start row then the end row, which the cross
  // entropy overwrote with the (scaled) loss gradient; clamped labels, start then end (2B).
  bool span_labels = false;
  device_array span_logits, span_label_ids, span_loss, span_correct;
  bool filled = false; // set by forward, cleared by backward
};

class part {
public:
  // The device copy of `params` (a range of a config; values f32, f16 or bf16),
  // working copies in `type`. Throws std::runtime_error naming what is wrong (a parameter
  // without a value, no cuBLASLt). Raises the device pool's release threshold,
  // so freed activations stay cached between steps. deterministic (devices.deterministic):
  // every gradient summed in a fixed order (ordered sums instead of float atomics, no
  // split-K products), so two runs give the same bits. masters false: the matrices and
  // tables read in a half storage type keep only that working copy on the device, 4 bytes
  // per element less (their f32 masters live with an optimizer elsewhere: a CUDA stage's
  // shard); optimizer_step and download_values then throw.
  // resident false (ZeRO-3; needs masters false): nothing of the parameters is on the device
  // until a gate binds it (set_gate, bind_value, bind_gradient); params' values must still
  // be defined (the part finds its layout through them) but are not copied.
  part(const bert_parameters& params, cuda::elem type, cudaStream_t stream, bool deterministic = false,
       bool masters = true, bool resident = true);
  ~part();
  part(const part&) = delete;
  part& operator=(const part&) = delete;

  const bert_config& config() const;
  const bert_range& range() const;
  cuda::elem type() const;
  cudaStream_t stream() const;
  std::size_t size() const;                  // parameters, in bert_parameters' order
  std::int64_t parameter_count() const;      // their elements
  std::int64_t numel(std::size_t i) const;

  // Forward of one micro-batch (eval mode, ctx.mode == run_mode::eval: no dropout; a
  // SQuAD batch without start/end positions computes the logits only). hidden_in: the previous stage's output, (B * T, H) of the
  // storage type on the device, taken into the stash (ignored, may be empty, with the
  // embeddings); it must have been allocated on the part's stream (or on a stream whose
  // work the part's stream is ordered after), since the stash frees it on its own stream
  // once the backward has read it. The batch is host-side: the ids (with the embeddings), the attention mask
  // (every range) and the labels (with the head); it is validated first and a bad tensor
  // throws naming it. grad_scale: with the head, the loss gradient's scale (loss scale /
  // micro-batches), applied now (the cross entropy leaves the gradient in the logits).
  // Returns the output, (B * T, H) on the device, owned by the stash (null with the head).
  const void* forward(device_array hidden_in, const bert_batch& batch, const forward_context& ctx,
                      float grad_scale, part_stash& stash);
  // The head's losses of the stash's forward (waits for the stream).
  bert_losses losses(const part_stash& stash);
  // The SQuAD head's start and end logits of the stash's forward, (B, T) f32 on the host
  // (waits for the stream). Throws for a range without the SQuAD head.
  squad_logits span_logits(const part_stash& stash);
  // dy: the gradient of the output on the device (ignored with the head). Adds every
  // parameter gradient; returns d hidden_in (empty with the embeddings). Empties the stash.
  // on_enqueued, when set: called on the caller's thread as each part of the range has
  // enqueued its backward (backward_options::on_done's ids: head_done, each layer's index,
  // embeddings_done), so work behind it on the stream (a gradient copy after an event)
  // can be queued while the rest of the backward is enqueued.
  device_array backward(const void* dy, part_stash& stash,
                        const std::function<void(std::int64_t part)>& on_enqueued = {});

  // Values: entry i's (f32, f16 or bf16, its shape) into the master and working copy.
  void load_value(std::size_t i, const tensor& value);
  // A new version (values[i]: entry i's, as load_value takes it) uploaded on a stream of the
  // part's own, part by part in the forward's order, after the work already enqueued on the
  // part's stream (which reads the old weights); each forward then waits for its part's
  // copies only, so the upload overlaps the first parts' compute. The copies read `values`
  // after this returns: from pinned memory they are asynchronous (pageable memory works, the
  // host then waits for each copy), and the caller must not change them before
  // wait_upload_read(). Returns without waiting.
  void upload_version(const std::vector<tensor>& values);
  // Waits until the last upload_version's copies have read their host values.
  void wait_upload_read();
  // The f32 gradients (and masters) into host f32 tensors of the entries' shapes; waits.
  void download_gradients(const std::vector<tensor>& into);
  void download_values(const std::vector<tensor>& into);
  void zero_gradients();
  // Entry i's f32 gradient on the device (numel(i) floats), for copies on another stream.
  const float* gradient_data(std::size_t i) const;
  // AdamW over every parameter (masters, moments, then the working copies) from the
  // accumulated gradients; weight decay on the matrices and tables only (optim's
  // bert_no_decay); then the gradients are zeroed.
  void optimizer_step(const cpu::adam_params& params);

  // ZeRO-3 (a part made with resident false). The gate is told just before and just after
  // each part of the range (backward_options::on_done's ids) is enqueued, in the forward and
  // the backward, and binds what that part reads: bind_value puts entry i's value (f32, f16
  // or bf16, from the host, read before the call returns) on the device through a stream of
  // the part's own, which the compute waits for as the part starts (so the copies overlap
  // the previous part's compute); unbind_value frees it on the part's stream, after the
  // work enqueued so far; bind_gradient allocates entry i's f32 gradient zeroed on the
  // part's stream, unbind_gradient frees it. After enter, every
  // tensor the part reads must be bound (and in the backward every gradient it adds to),
  // or the forward or backward throws naming it.
  void set_gate(part_gate* gate);
  bool resident() const;
  void bind_value(std::size_t i, const tensor& value);
  // The bind stream's next allocations and copies wait for `event` (recorded on the part's
  // stream after an earlier part's frees: a window of bound parts, cuda_zero3.hpp).
  void bind_after(cudaEvent_t event);
  // The bind stream (made on first use): a caller copying from pinned memory records there
  // when the copies have read it.
  cudaStream_t bind_stream();
  void unbind_value(std::size_t i);
  void bind_gradient(std::size_t i);
  // after: the gradient's free is ordered on that stream instead of the part's (a copy
  // stream reading it last; the caller ordered it after the part's stream).
  void unbind_gradient(std::size_t i, cudaStream_t after = nullptr);

  struct impl;

private:
  std::unique_ptr<impl> impl_;
};

} // namespace dsa::bert::gpu
