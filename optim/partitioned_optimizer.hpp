// ZeRO-1/2 optimizer of one data-parallel rank: fp32 master weights, exp_avg and
// exp_avg_sq of its partition of a stage's flat layout only (12 bytes per
// partition element), updated with Adam / AdamW / LAMB exactly as
// optim::optimizer updates whole tensors: the same kernels per tensor piece, per-
// tensor weight decay, and for LAMB each tensor's trust ratio from the norms of
// the whole tensor. Masters, moments and the working weights written here are bit
// for bit those of optim::optimizer on one rank, for any rank count.
//
// LAMB and tensors that span ranks: the kernel sums a tensor's squares per norm
// block (cpu::lamb_norm_block elements from the tensor's start; the layout's
// alignment keeps each block on one rank) and adds the block sums in order. Each
// step, every rank writes the block sums of its pieces of spanning tensors into
// an exchange vector (zeros elsewhere) and the caller's `combine` returns the
// element-wise sum over ranks. Every entry is non-zero on one rank only, so the
// sum is exact whatever the order: an allreduce, or an allgather followed by
// add_gathered, both give every rank the same bits. Tensors that lie on one rank
// need no exchange.
//
// The three arrays live in a chunked_state: in memory by default, or in NVMe swap
// files (io/aio/swap_store.hpp) streamed through a few buffers one sub-group at a
// time. The update runs chunk by chunk with the same kernels, so the bits do not
// depend on where the state lives or on the chunk size.
//
// Not thread-safe: one thread calls step() (the kernels parallelize inside).
#pragma once

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "optim/chunked_state.hpp"
#include "optim/flat_layout.hpp"
#include "optim/optimizer.hpp"
#include "optim/zeroone_adam.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dsa::optim {

// One rank's fp32 state: master, exp_avg, exp_avg_sq, each (partition_numel) f32,
// padding elements 0; and the number of steps taken.
struct partition_state {
  tensor master;
  tensor exp_avg;
  tensor exp_avg_sq;
  std::int64_t step = 0;
};

// partial: this rank's exchange vector; returns the element-wise sum over every
// rank's vector (same length), identical on every rank. Called by every rank in
// the same steps (see partitioned_optimizer::exchange_size).
using norm_combine = std::function<expected<std::vector<double>>(const std::vector<double>& partial)>;

// Receives consecutive windows of a partition's working weights (1-D, any float dtype).
using working_sink = std::function<status(const tensor& window)>;

struct partition_step {
  // (partition_numel) f32: this rank's partition of the gradients summed over the ranks.
  // Consumed: scaled in place, and LAMB leaves its update direction there. Padding
  // elements are never read.
  tensor grad;
  // Gradients are multiplied by this first (step_decision::grad_scale: 1 / (loss scale x clip)),
  // as the whole shard (train::whole_shard) does before optimizer::step; 1 leaves them as they are.
  double grad_scale = 1.0;
  // Undefined, or (partition_numel) f32/f16/bf16: receives the partition's updated working
  // weights, padding 0 (what the ranks all-gather).
  tensor working;
  // LAMB only, when exchange_size() > 0.
  norm_combine combine;
  // Instead of `working`: the updated working weights of dtype sink_type handed over in
  // partition order, window by window (consecutive, from element 0 to partition_numel),
  // padding 0; at most sink_window elements each. ZeRO-3 writes them straight into the
  // stage's weight store, so no whole copy of the partition exists.
  working_sink sink;
  dtype sink_type = dtype::f32;
  std::int64_t sink_window = 1 << 20;
  // A streamed update (Adam/AdamW, grad_scale 1, `working`, not a sink): whether the
  // gradients of the partition's elements [lo, hi) are final yet; each chunk is updated
  // once they are (chunked_state::sweep_when; the store's wake() makes it ask again). The
  // chunks' order is the store's (swap_options::descending: as a backward finishes them).
  chunk_ready ready;
};

// t must be a contiguous CPU tensor of n elements, f32 (any_float: f32, f16 or bf16); the
// error names `what` and the rank.
status check_flat(const tensor& t, const char* what, std::int64_t n, std::uint32_t rank, bool any_float);

// 1-bit Adam over a partition (optimizer.type OneBitAdam with ZeRO stage 1 or 2; see
// partitioned_optimizer::step_onebit).
struct onebit_partition_step {
  // While warming up (compressed_next() false): (partition_numel) f32, this rank's partition
  // of the gradients averaged over the ranks. Compressed: (padded_numel) f32, this rank's
  // own gradients of the whole layout. Consumed: scaled in place.
  tensor grad;
  double grad_scale = 1.0;
  // (partition_numel) f32/f16/bf16: receives the partition's updated working weights.
  tensor working;
  // 0/1 Adam's local steps (local_params() after the step): (padded_numel) f32/f16/bf16,
  // receives this rank's whole working weights instead (nothing to gather).
  tensor whole_working;
  // Replaces one parameter group's values (count values, the group's tensors in layout
  // order: 1-bit Adam's and LAMB's momentum, 0/1 Adam's gradients or accumulated moves)
  // with their compressed average over the ranks; reset_errors: zero the group's error
  // buffers first (0/1 Adam entering its local steps).
  std::function<status(const std::string& group, float* values, std::int64_t count, bool reset_errors)> exchange;
  // Fills whole (padded_numel) with every rank's `mine` (partition_numel) in rank order.
  std::function<status(float* whole, const float* mine)> gather;
  // 1-bit LAMB only: element-wise sums (of block sums of squares; every entry non-zero on
  // one rank at most, so the sum is exact) and maxima over the ranks, in place (the vectors
  // keep their storage: the caller holds pointers into them).
  std::function<status(std::vector<double>& values)> sum;
  std::function<status(std::vector<float>& values)> max;
};

class partitioned_optimizer {
public:
  // From a stage's whole initial parameters (tensors in layout order, f32/f16/bf16,
  // shapes as the layout's): copies this rank's pieces into fresh masters; moments 0.
  // `store` (empty, numel = partition_numel) receives the arrays chunk by chunk; without
  // one they are allocated in memory.
  static expected<partitioned_optimizer> create(const optimizer_config& cfg, flat_layout layout, std::uint32_t rank,
                                                const std::vector<tensor>& initial,
                                                std::unique_ptr<chunked_state> store = nullptr);
  // From a saved or repartitioned state (partition_checkpoint.hpp): without a store the
  // tensors are taken over, not copied; with one they are written into it. Non-zero
  // padding is refused.
  static expected<partitioned_optimizer> create(const optimizer_config& cfg, flat_layout layout, std::uint32_t rank,
                                                partition_state state, std::unique_ptr<chunked_state> store = nullptr);
  // The same state written into `store` (required) a chunk at a time: fill(lo, hi, arrays)
  // writes the master, exp_avg and exp_avg_sq of the partition's elements [lo, hi), padding
  // zero (saved_partitions::fill), so no whole copy of the state is ever in memory.
  using state_fill = std::function<status(std::int64_t lo, std::int64_t hi, float* const arrays[3])>;
  static expected<partitioned_optimizer> create(const optimizer_config& cfg, flat_layout layout, std::uint32_t rank,
                                                std::int64_t step, const state_fill& fill,
                                                std::unique_ptr<chunked_state> store);

  void set_lr(double lr) { lr_ = lr; }
  void set_betas(double beta1, double beta2);

  // One update of the partition (increments the step count first). On an error from
  // combine, m and v of the partition are already updated and the weights not: the
  // run must stop, as after any failed collective.
  status step(const partition_step& in);
  // The working weights of the partition without a step (a skipped step, or the first
  // parameters): working (partition_numel) f32/f16/bf16, padding 0.
  status write_working(const tensor& working) const;
  // The same through a sink, as partition_step::sink.
  status write_working(const working_sink& sink, dtype type, std::int64_t window) const;
  // 1-bit Adam (cfg.type onebit_adam, the state in memory): as optim::onebit_adam updates
  // BERT's two groups of whole parameters ("decay", then "no_decay", each its own exchange),
  // bit for bit, with this rank's partition of the masters and variance. The momentum is
  // kept whole, in group order (each group's tensors end to end, as the stage-0 shard's
  // group buffers, so each exchange runs in place): 1-bit compression runs on every rank's
  // whole local momentum, and after an exchange every rank holds the same average. While
  // warming up only the partition's momentum is updated (exp_avg); the first compressed
  // step after that, or after a resume, all-gathers it (through a transient whole copy in
  // layout order). Masked elements (mask_momentum) are multiplied by 0 after each exchange,
  // as exp_avg_mask does.
  // 1-bit LAMB (cfg.type onebit_lamb) the same way, as optim::onebit_lamb on the stage-0
  // shard's one fused group (onebit_lamb_group: one exchange of the whole momentum) bit for
  // bit: the trust coefficients' and factors' norms from block sums
  // of squares exchanged with `sum`, the factors' largest ratio with `max`; the per-tensor
  // coefficients, factors and scalings are the same on every rank, the fresh variance is
  // partitioned like the variance.
  // 0/1 Adam (cfg.type zeroone_adam) as optim::zeroone_adam on the stage-0 shard's groups,
  // bit for bit (zeroone_math, zeroone_schedule). Phase A: the partition's masters and
  // moments, from the partition of the averaged gradients on variance steps, else from every
  // rank's whole gradients exchanged compressed (a transient whole copy in group order).
  // Phase B (local steps): each rank moves its own whole parameters, so the momentum, the
  // frozen variance, the accumulated move and the parameters are kept whole in group order
  // (all-gathered from the partitions on the first local step, or after a resume), and the
  // partition keeps the synchronised point: its masters are the anchor and its momentum the
  // agreed one, which is what a checkpoint between synchronisations saves (stage 0 saves
  // rank 0's local values). A synchronisation exchanges the accumulated move, moves the
  // partition's masters from the anchor, copies the rebuilt momentum into the partition and
  // all-gathers the masters. The working weights are written whole (in.whole_working).
  // All three types through this call.
  status step_onebit(const onebit_partition_step& in);
  // Whether the next compressed-optimizer step takes this rank's own whole gradient (1-bit
  // Adam's and LAMB's compressed steps, 0/1 Adam's steps other than variance steps).
  bool compressed_next() const;
  // 0/1 Adam in its local steps: this rank's parameters are its own (whole_working holds
  // them; a skipped step writes them again with write_local_working).
  bool local_params() const { return zo_whole_valid_; }
  status write_local_working(const tensor& whole_working) const;
  // exp_avg_mask: elements [from, numel) of tensor `t` (layout order) get no momentum.
  void mask_momentum(std::size_t t, std::int64_t from);
  // BERT's parameter groups as step_onebit exchanges them: {name, elements}, non-empty only.
  std::vector<std::pair<std::string, std::int64_t>> onebit_groups() const;
  // Bytes of the whole momentum (and 1-bit LAMB's fresh variance) kept beside the state.
  std::int64_t onebit_bytes() const {
    return static_cast<std::int64_t>((whole_m_.size() + lamb_fresh_.size() + zo_v_.size() + zo_u_.size() +
                                      zo_p_.size()) *
                                     sizeof(float));
  }
  // 1-bit LAMB's state beyond the partition (saved once, from any rank, with the fresh
  // variance whole): "coeff", "factor", "scaling" (one value per tensor in layout order;
  // scaling empty before the first compressed step) and, once frozen,
  // "<name>.exp_avg_sq_fresh" per tensor from `whole_fresh` (padded_numel, every rank's
  // lamb_fresh() gathered in rank order). Copies.
  std::map<std::string, tensor> lamb_state(const float* whole_fresh) const;
  // This rank's partition of the fresh variance (zeros until the freeze; then what
  // lamb_state saves, gathered, once compressed_next()).
  const std::vector<float>& lamb_fresh() const { return lamb_fresh_; }
  // Restores lamb_state's form (any rank count: the fresh variance is cut to this
  // partition); a missing or misshapen entry is an error naming it.
  status load_lamb_state(const std::map<std::string, tensor>& state);

  // Sum of squares of this rank's gradient elements, padding left out, for the global
  // gradient norm (add the ranks' sums). grad: (partition_numel) f32.
  double grad_sum_of_squares(const tensor& grad) const;

  // Length of the LAMB exchange vector: 2 doubles per norm block of every tensor that
  // spans ranks, the same on every rank; 0 for Adam/AdamW and when no tensor spans ranks
  // (then combine is never called).
  std::size_t exchange_size() const { return exchange_.size(); }
  // Sum over ranks of an allgather of exchange vectors: gathered holds ranks x per_rank
  // doubles, rank-major; returns per_rank sums.
  static std::vector<double> add_gathered(const std::vector<double>& gathered, std::uint32_t ranks);

  const flat_layout& layout() const { return layout_; }
  std::uint32_t rank() const { return rank_; }
  flat_range partition() const { return layout_.partition(rank_); }
  const std::vector<flat_piece>& pieces() const { return pieces_; }
  const optimizer_config& settings() const { return cfg_; }
  std::int64_t step_count() const { return step_; }
  // Bytes of optimizer state: 12 x partition_numel (fp32 master, exp_avg, exp_avg_sq),
  // wherever it lives.
  std::int64_t state_bytes() const { return 12 * layout_.partition_numel(); }
  // What of it is in memory: all of it, or the swap buffers (chunked_state::resident_bytes).
  std::int64_t resident_bytes() const { return store_->resident_bytes(); }
  const chunked_state& store() const { return *store_; }
  // Waits for the store's transfers still in flight (the last update's writes); their error.
  status flush() { return store_->flush(); }
  // Visits the state chunk by chunk with the `read` arrays present, writing nothing back:
  // a checkpoint that streams swapped state instead of reading it back whole.
  status read_chunks(unsigned read, const chunk_fn& fn) const { return store_->sweep(read, 0, fn); }
  // Scratch beyond the state, in bytes (LAMB block sums and the exchange vector).
  std::int64_t scratch_bytes() const;
  // Trust ratios of the last LAMB step, one per piece in pieces() order.
  const std::vector<float>& last_lamb_coeffs() const { return lamb_coeffs_; }
  // The whole-tensor sums behind them: {sum p^2, sum u^2} per piece, 2 x pieces() values.
  const std::vector<double>& last_lamb_sums() const { return lamb_sums_; }

  // The state: views of the arrays when they are in memory (valid while no step runs),
  // a copy read back from the store otherwise; only the arrays in `which` (a bit mask of
  // chunked_state.hpp's arrays), the others undefined.
  expected<partition_state> read_state(unsigned which = all_arrays) const;
  // The same for a state in memory only (tests): a broken invariant otherwise.
  partition_state state() const;
  // Whether the state is in memory (not swapped): state() and restore_state() work.
  bool resident() const;
  // Speculation's rollback: overwrites the in-memory arrays and the step count with
  // `saved` (a copy taken from state() before a step; a broken invariant when swapped),
  // or, when saved.master is undefined, the step count alone (a swapped state's
  // speculation wrote elsewhere: aio::swap_store::discard_shadow).
  void restore_state(const partition_state& saved);

private:
  partitioned_optimizer(const optimizer_config& cfg, flat_layout layout, std::uint32_t rank);
  static expected<partitioned_optimizer> finish_create(const optimizer_config& cfg, flat_layout layout,
                                                       std::uint32_t rank, std::unique_ptr<chunked_state> store,
                                                       std::int64_t step);
  status init_scratch();
  class working_out; // where a step's working weights go (a whole tensor or a sink)
  status step_adam(float* grad, working_out& out, const partition_step& in);
  status step_lamb(float* grad, working_out& out, const norm_combine& combine);
  status write_working(working_out& out) const;
  void zero_padding(const tensor& working) const;
  // Calls fn(piece index, the part of that piece inside chunk c) for every piece meeting c.
  template <class Fn>
  void each_piece_in(const state_chunk& c, Fn&& fn) const;

  optimizer_config cfg_;
  flat_layout layout_;
  std::uint32_t rank_ = 0;
  std::vector<flat_piece> pieces_; // this rank's, in flat order
  std::unique_ptr<chunked_state> store_; // master, exp_avg, exp_avg_sq
  std::int64_t step_ = 0;
  double lr_ = 0.0;
  // LAMB block sums: of pieces of tensors on this rank only in local_, of pieces of tensors
  // spanning ranks in exchange_ (every such tensor's blocks at exchange_at_[tensor]).
  std::vector<std::int64_t> piece_sums_at_; // per piece: its first block's offset in local_ or exchange_
  std::vector<double> local_;
  std::vector<double> exchange_;
  std::vector<std::int64_t> exchange_at_; // per tensor; -1 when it lies on one rank
  std::vector<float> lamb_coeffs_;
  std::vector<double> lamb_sums_;
  // 1-bit Adam: the whole momentum in group order (valid on every rank once gathered),
  // each tensor's offset in it, the groups {name, offset, numel}, the masked ranges.
  struct onebit_group {
    std::string name;
    std::int64_t offset = 0, numel = 0;
  };
  std::vector<float> whole_m_;
  std::vector<std::int64_t> group_offset_;
  std::vector<onebit_group> groups_;
  std::vector<flat_range> masked_;
  bool whole_m_valid_ = false;
  // 1-bit LAMB: per tensor in layout order; the fresh variance of the partition.
  std::vector<float> lamb_coeff_, lamb_factor_, lamb_scaling_, lamb_fresh_;
  std::vector<std::int64_t> lamb_block_base_; // per tensor: its first block in the exchanged sums
  std::int64_t lamb_blocks_ = 0;
  // 0/1 Adam: the schedule; whole variance, accumulated move and parameters in group order
  // (allocated up front: phase B's peak); valid once gathered.
  zeroone_schedule zo_sched_;
  std::vector<float> zo_v_, zo_u_, zo_p_;

  float zo_lrs_ = 0;
  bool zo_whole_valid_ = false, zo_errors_reset_ = false;
  zeroone_adam_params zeroone_params() const;
  status step_zeroone(const onebit_partition_step& in);
  status zeroone_gather_whole(const onebit_partition_step& in, const float* master, const float* m, const float* v);
  status step_onebit_lamb(const onebit_partition_step& in);
  // dummy_first_step's step 1: every group's exchange once on zeros, no update.
  status dummy_exchange(const onebit_partition_step& in);
  status gather_momentum(const onebit_partition_step& in, const float* mine);
  // Layout order (padded_numel) to group order (each tensor at group_offset_).
  void to_group_order(const float* layout_order, float* whole) const;
  // Every rank's `mine` (partition_numel), gathered, into `whole` in group order.
  status gather_group_order(const onebit_partition_step& in, const float* mine, float* whole) const;
  // Masked elements (exp_avg_mask) multiplied by 0, as the stage-0 optimizers' mask does
  // (a negative value gives -0 there too).
  void mask_zero(float* whole) const;
  // A 1-bit step's start: the inputs checked, the gradients scaled, the step counted.
  struct onebit_views {
    float *master, *m, *v, *grad;
  };
  expected<onebit_views> onebit_begin(const onebit_partition_step& in);
  status init_onebit();
};

} // namespace dsa::optim
