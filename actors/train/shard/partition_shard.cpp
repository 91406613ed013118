// A shard holding a partition of its stage; see partition_shard.hpp.
#include "actors/train/shard/partition_shard.hpp"

#include "actors/data_parallel.hpp"
#include "io/aio/swap_store.hpp"
#include "optim/partition_checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

namespace dsa::train {
tensor layout_view(const tensor& flat, const optim::flat_tensor& t) {
  return flat.slice_rows(t.offset, t.offset + t.numel).reshape(t.shape);
}

expected<optim::flat_layout> stage_flat_layout(const std::vector<bert::param_spec>& specs, std::uint32_t ranks) {
  std::vector<optim::flat_tensor_spec> flat;
  for (const auto& s : specs) flat.push_back(optim::bert_flat_tensor(s.name, s.shape));
  return optim::flat_layout::create(std::move(flat), ranks);
}

partition_shard::partition_shard(shard_options options)
    : shard_base(std::move(options)), stream_(options_.participant, *options_.decider) {
  if (options_.offload) swap_tracer_ = std::make_shared<swap_tracer>();
}

expected<optim::partitioned_optimizer> partition_shard::create(const optim::flat_layout& layout,
                                                               const std::vector<tensor>& initial) {
  std::unique_ptr<optim::chunked_state> store; // none: in memory
  if (const auto& off = options_.offload) {
    aio::swap_options so;
    so.dir = off->dir;
    so.name = fmt::format("stage{}", options_.participant);
    so.numel = layout.partition_numel();
    so.sub_group = off->sub_group;
    so.granule = layout.alignment();
    so.buffer_count = off->buffer_count;
    so.pipeline_read = off->pipeline_read;
    so.pipeline_write = off->pipeline_write;
    so.descending = stream_elements() > 0; // a streamed update finds the last chunks final first
    so.observer = [tracer = swap_tracer_](const aio::swap_transfer& t) { tracer->observe(t); };
    DSA_ASSIGN_OR_RETURN(auto swap, aio::swap_store::create(off->engine, so));
    swap_ = swap.get();
    store = std::move(swap);
  }
  if (options_.resume_partitions) {
    DSA_ASSIGN_OR_RETURN(auto sources, options_.resume_partitions());
    DSA_ASSIGN_OR_RETURN(auto index, optim::saved_partitions::index(std::move(sources)));
    if (store) {
      // Swapped: the saved state goes into the swap store a chunk at a time (no whole
      // partition of masters and moments in memory, which a budget could not hold).
      DSA_TRY(index.check(layout, options_.zero_rank));
      const std::uint32_t rank = options_.zero_rank;
      auto fill = [&index, &layout, rank](std::int64_t lo, std::int64_t hi, float* const arrays[3]) {
        return index.fill(layout, rank, lo, hi, arrays);
      };
      return optim::partitioned_optimizer::create(options_.optimizer, layout, rank, index.step(), fill,
                                                  std::move(store));
    }
    DSA_ASSIGN_OR_RETURN(auto state, index.partition(layout, options_.zero_rank));
    return optim::partitioned_optimizer::create(options_.optimizer, layout, options_.zero_rank, std::move(state),
                                                std::move(store));
  }
  DSA_CHECK(options_.resume_masters.empty() && !options_.resume_state,
            "optimizer shard {}: a partitioned shard resumes from resume_partitions", options_.participant);
  return optim::partitioned_optimizer::create(options_.optimizer, layout, options_.zero_rank, initial, std::move(store));
}

void partition_shard::init(const std::vector<tensor>& initial) {
  const auto& specs = options_.specs;
  DSA_CHECK(initial.size() == specs.size(), "optimizer shard {}: {} initial tensors for {} parameters",
            options_.participant, initial.size(), specs.size());
  DSA_CHECK((options_.peers || options_.zero_ranks == 1) && options_.zero_rank < options_.zero_ranks,
            "optimizer shard {}: ZeRO rank {} of {} without its peers", options_.participant, options_.zero_rank,
            options_.zero_ranks);
  // The checkpoint's gathers size their results by the peers, the partitions by zero_ranks.
  DSA_CHECK(!options_.peers || options_.peers->size() == static_cast<int>(options_.zero_ranks),
            "optimizer shard {}: {} peers for ZeRO over {} ranks", options_.participant, options_.peers->size(),
            options_.zero_ranks);
  auto layout = stage_flat_layout(specs, options_.zero_ranks);
  if (!layout) throw std::runtime_error(layout.err().message);
  auto created = create(*layout, initial);
  if (!created) throw std::runtime_error(created.err().message);
  part_.emplace(std::move(*created));
  if (swap_ && stream_elements() > 0) stream_.attach(*part_, *swap_);
  const bool partition_grads = options_.partition_gradients;
  if (const tensor& shared = options_.shared_gradients; shared.defined()) {
    DSA_CHECK(partition_grads && options_.whole_gradient < 0 && shared.type() == dtype::f32 &&
                  shared.numel() == layout->partition_numel() && shared.is_contiguous(),
              "optimizer shard {}: shared gradient partition {} for a partition of {} elements",
              options_.participant, shared.describe(), layout->partition_numel());
    flat_grad_ = shared;
  } else {
    flat_grad_ = tensor::zeros({partition_grads ? layout->partition_numel() : layout->padded_numel()}, dtype::f32);
  }
  if (partition_grads && options_.whole_gradient >= 0) {
    DSA_CHECK(static_cast<std::size_t>(options_.whole_gradient) < specs.size(),
              "optimizer shard {}: whole gradient {} of {} parameters", options_.participant, options_.whole_gradient,
              specs.size());
    whole_grad_ = tensor::zeros(specs[static_cast<std::size_t>(options_.whole_gradient)].shape, dtype::f32);
  }
  if (!options_.fetcher) // ZeRO-3 writes its versions into the fetcher's store instead
    flat_working_ = tensor::zeros({options_.partition_parameters ? layout->partition_numel() : layout->padded_numel()},
                                 working_dtype(options_.working));
  if (options_.optimizer.compressed()) init_onebit();
}

std::vector<tensor> partition_shard::gradient_buffers() {
  std::vector<tensor> out;
  const auto& tensors = part_->layout().tensors();
  if (!options_.partition_gradients) {
    for (const auto& t : tensors) out.push_back(layout_view(flat_grad_, t));
    return out;
  }
  // Each tensor's piece of this rank's partition, as a view of flat_grad_ (1-D, maybe empty).
  const auto parts = gradient_parts();
  const std::int64_t lo = part_->partition().lo;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (static_cast<int>(i) == options_.whole_gradient) {
      out.push_back(whole_grad_);
      continue;
    }
    const std::int64_t kept = parts[i].hi - parts[i].lo;
    const std::int64_t first = kept > 0 ? tensors[i].offset + parts[i].lo - lo : 0;
    out.push_back(flat_grad_.slice_rows(first, first + kept));
  }
  return out;
}

std::vector<actors::gradient_part> partition_shard::gradient_parts() {
  if (!options_.partition_gradients) return {};
  const auto& layout = part_->layout();
  std::vector<actors::gradient_part> parts(layout.tensors().size());
  for (const auto& p : layout.pieces(part_->partition()))
    parts[p.tensor] = {p.tensor_offset, p.tensor_offset + p.count};
  if (options_.whole_gradient >= 0)
    parts[static_cast<std::size_t>(options_.whole_gradient)] = {0, whole_grad_.numel()};
  return parts;
}

tensor partition_shard::partition_grad() {
  const optim::flat_range mine = part_->partition();
  if (!options_.partition_gradients) return flat_grad_.slice_rows(mine.lo, mine.hi);
  if (whole_grad_.defined())
    for (const auto& p : part_->layout().pieces(mine))
      if (static_cast<int>(p.tensor) == options_.whole_gradient)
        flat_grad_.slice_rows(p.flat_offset - mine.lo, p.flat_offset - mine.lo + p.count)
            .copy_from(whole_grad_.flatten().slice_rows(p.tensor_offset, p.tensor_offset + p.count));
  return flat_grad_;
}

void partition_shard::advance(std::uint32_t step, const step_decision& d) {
  if (swap_) swap_tracer_->update_begins(step, swap_->sweeps() + 1);
  status s = options_.fetcher ? advance_into_fetcher(d) : advance_partition(d, {});
  if (swap_) swap_tracer_->update_ends(swap_->sweeps());
  if (!s) throw std::runtime_error(fmt::format("ZeRO update of stage {}: {}", options_.participant, s.err().message));
}

status partition_shard::advance_into_fetcher(const step_decision& d) {
  param_fetcher& f = *options_.fetcher;
  if (d.skip) return f.keep_version(); // a skipped step: the store holds these weights already
  DSA_TRY(f.begin_version());
  const tensor memory = f.version_memory();
  status s;
  if (memory.defined()) {
    s = advance_partition(d, memory);
  } else {
    optim::working_sink sink = [&f](const tensor& window) { return f.version_window(window); };
    s = advance_partition(d, {}, sink);
  }
  status ended = f.end_version(); // always: closes the write
  DSA_TRY(s);
  return ended;
}

std::int64_t partition_shard::version_window() const {
  return std::min<std::int64_t>(part_->layout().partition_numel(), shard_version_window_elements);
}

status partition_shard::advance_partition(const step_decision& d, tensor working, const optim::working_sink& sink) {
  const optim::flat_range mine = part_->partition();
  if (!working.defined() && !sink)
    working = options_.partition_parameters ? flat_working_ : flat_working_.slice_rows(mine.lo, mine.hi);
  const dtype type = working_dtype(options_.working);
  working_whole_ = false;
  if (d.skip && zchannel_ && part_->local_params()) {
    working_whole_ = true; // 0/1 Adam between synchronisations: this rank's own weights stay
    return part_->write_local_working(flat_working_);
  }
  if (d.skip) return sink ? part_->write_working(sink, type, version_window()) : part_->write_working(working);
  part_->set_lr(d.lr);
  if (d.set_betas) part_->set_betas(d.beta1, d.beta2);
  if (zchannel_) return advance_onebit(d, working);
  optim::partition_step in;
  in.grad = partition_grad();
  in.grad_scale = d.grad_scale;
  in.working = sink ? tensor() : working;
  in.sink = sink;
  in.sink_type = type;
  in.sink_window = version_window();
  in.ready = stream_ready_;
  in.combine = [this](const std::vector<double>& partial) { return sum_over_ranks(partial); };
  return part_->step(in);
}

// Element-wise sums over the ranks through an all-gather (every rank adds the same values in
// rank order: the same bits everywhere).
expected<std::vector<double>> partition_shard::sum_over_ranks(const std::vector<double>& partial) const {
  const auto ranks = static_cast<std::uint32_t>(options_.peers->size());
  std::vector<double> all(partial.size() * ranks);
  DSA_TRY(actors::log_collective(options_.logger, "all_gather", static_cast<std::int64_t>(all.size()) * 8,
                                 shard_name(), [&] {
                                   return options_.peers->allgather(all.data(), partial.data(), dtype::i64,
                                                                    static_cast<std::int64_t>(all.size()));
                                 }));
  return optim::partitioned_optimizer::add_gathered(all, ranks);
}

void partition_shard::publish(const step_decision&, std::vector<tensor>& out) {
  const optim::flat_range mine = part_->partition();
  out.clear();
  version_bytes_ = static_cast<std::int64_t>(flat_working_.nbytes());
  if (options_.fetcher) {
    // ZeRO-3: the version is in the fetcher's store already (a window at a time passed
    // through the sink's scratch, when the store is not in memory).
    version_bytes_ = options_.fetcher->version_memory().defined()
                         ? 0
                         : version_window() * static_cast<std::int64_t>(dtype_size(working_dtype(options_.working)));
    out.push_back(tensor());
  } else if (options_.partition_parameters) {
    out.push_back(flat_working_); // ZeRO-3: the stage's fetcher gathers from the partitions
  } else {
    if (!working_whole_) gather_flat(flat_working_, flat_working_.slice_rows(mine.lo, mine.hi), "updated weights");
    working_whole_ = false; // each update says again
    for (const auto& t : part_->layout().tensors()) out.push_back(layout_view(flat_working_, t));
  }
}

void partition_shard::gather_flat(const tensor& all, const tensor& mine, const char* what) const {
  if (options_.zero_ranks == 1) {
    if (all.raw_data() != mine.raw_data()) std::memcpy(all.raw_data(), mine.raw_data(), mine.nbytes());
    return;
  }
  if (auto g = actors::log_collective(
          options_.logger, "all_gather", static_cast<std::int64_t>(all.nbytes()), shard_name(),
          [&] { return options_.peers->allgather(all.raw_data(), mine.raw_data(), all.type(), all.numel()); });
      !g)
    throw std::runtime_error(fmt::format("gathering stage {}'s {} from the other ranks: {}", options_.participant, what,
                                         g.err().message));
}

void partition_shard::back_up() {
  backup& b = backup_;
  if (swap_) {
    // Swapped state: the speculative sweeps write to the swap's second files (the state
    // stays as it was until commit_shadow); only the gradients, which the step consumes,
    // and the step count and betas are kept here.
    if (auto s = swap_->begin_shadow(); !s)
      throw std::runtime_error(fmt::format("stage {}: speculative update: {}", options_.participant, s.err().message));
    b.part = optim::partition_state{};
    b.part.step = part_->step_count();
  } else {
    optim::partition_state live = part_->state();
    keep_copy(b.part.master, live.master);
    keep_copy(b.part.exp_avg, live.exp_avg);
    keep_copy(b.part.exp_avg_sq, live.exp_avg_sq);
    b.part.step = live.step;
  }
  keep_copy(b.grad, partition_grad());
  b.beta1 = part_->settings().beta1;
  b.beta2 = part_->settings().beta2;
}

void partition_shard::roll_back() {
  const backup& b = backup_;
  if (swap_)
    if (auto s = swap_->discard_shadow(); !s)
      throw std::runtime_error(fmt::format("rolling back stage {}'s speculative update: {}", options_.participant,
                                           s.err().message));
  part_->restore_state(b.part); // with the state swapped, the step count only: it never left its files
  partition_grad().copy_from(b.grad);
  part_->set_betas(b.beta1, b.beta2);
}

void partition_shard::keep_speculated() {
  if (swap_)
    if (auto s = swap_->commit_shadow(); !s)
      throw std::runtime_error(fmt::format("ZeRO update of stage {}: {}", options_.participant, s.err().message));
}

std::int64_t partition_shard::stream_elements() const {
  const auto type = options_.optimizer.type;
  const bool adam = type == optim::optimizer_type::adam || type == optim::optimizer_type::adamw;
  // With loss scaling the gradients are unscaled in place by the update (a redo would
  // need a copy of them): not streamed. Clipping is: speculatively (update_stream).
  if (!options_.offload || !adam || options_.decider->loss_scaling() || options_.fetcher ||
      options_.partition_parameters || options_.whole_gradient >= 0 || options_.exchanges_tied ||
      options_.shared_gradients.defined()) // a tied exchange, or a stage summing its gradient partition itself
    return 0;
  // Buckets of a quarter chunk: a chunk is final soon after the backward finished it,
  // whatever the buckets' boundaries.
  return std::max<std::int64_t>(options_.offload->sub_group / 4, 1);
}

void partition_shard::gradients_final(std::uint32_t step, std::uint32_t first) { stream_.gradients_final(step, first); }

void partition_shard::cancel() { stream_.cancel(); }

bool partition_shard::stream_update(std::uint32_t step) {
  DSA_CHECK(stream_elements() > 0 && swap_ && !speculation_pending(),
            "optimizer shard {}: a streamed update of step {} it cannot stream", options_.participant, step);
  const step_decision assumed = options_.decider->assume();
  const auto started = std::chrono::steady_clock::now(); // with the shadow's start (it waits for writes)
  if (!stream_.begin(step, assumed)) return false;
  stream_ready_ = stream_.ready(step);
  struct clear_hook {
    optim::chunk_ready& hook;
    ~clear_hook() { hook = nullptr; }
  } clear{stream_ready_};
  advance(step, assumed); // the sweep waits in stream_ready_ for each chunk's gradients
  // wall_clock_breakdown's optimizer time: what the update added after the backward.
  add_update_time(stream_.finished(step, started));
  return true;
}

void partition_shard::trace_attach(actors::trace_recorder* trace, std::uint32_t actor, std::int32_t stage) {
  if (swap_tracer_) swap_tracer_->attach(trace, actor, stage);
}

void partition_shard::trace_detach() {
  if (!swap_tracer_) return;
  if (swap_) swap_->wait_idle(); // the last step's writes and the next step's prefetch end
  swap_tracer_->detach();
}

std::string partition_shard::swap_report() const {
  if (!swap_) return {};
  const aio::swap_stats s = swap_->stats();
  const double moved = static_cast<double>(s.bytes_read + s.bytes_written);
  const double swept_s = static_cast<double>(s.wait_ns + s.compute_ns) * 1e-9;
  return fmt::format("stage {} NVMe swap: read {:.1f} MiB ({} chunk reads, {} of them prefetched before their update), "
                     "wrote {:.1f} MiB ({} chunk writes); the updates waited {:.3f} s for I/O and computed {:.3f} s "
                     "({:.1f}% waiting); {:.2f} GB/s achieved over {:.3f} s with a transfer in flight{}",
                     options_.participant, static_cast<double>(s.bytes_read) / (1 << 20), s.chunk_reads,
                     s.chunks_prefetched, static_cast<double>(s.bytes_written) / (1 << 20), s.chunk_writes,
                     static_cast<double>(s.wait_ns) * 1e-9, static_cast<double>(s.compute_ns) * 1e-9,
                     swept_s > 0 ? 100 * static_cast<double>(s.wait_ns) * 1e-9 / swept_s : 0.0,
                     s.busy_ns > 0 ? moved / static_cast<double>(s.busy_ns) : 0.0,
                     static_cast<double>(s.busy_ns) * 1e-9, stream_.report(s.gate_ns));
}

shard_bytes partition_shard::held_bytes() const {
  shard_bytes b;
  if (!part_) return b; // before init: nothing held yet
  // Shared gradients are the stage's (counted there).
  if (!options_.shared_gradients.defined())
    b.gradients = static_cast<std::int64_t>(flat_grad_.nbytes() + (whole_grad_.defined() ? whole_grad_.nbytes() : 0));
  if (const auto* mem = dynamic_cast<const optim::resident_state*>(&part_->store())) {
    // The arrays' own sizes, so an allocation of the wrong size shows against the accounting.
    b.masters = static_cast<std::int64_t>(mem->array(optim::master_array).nbytes());
    b.moments = static_cast<std::int64_t>(mem->array(optim::exp_avg_array).nbytes() +
                                          mem->array(optim::exp_avg_sq_array).nbytes());
  } else {
    b.swap_buffers = part_->resident_bytes();
  }
  b.moments += part_->onebit_bytes(); // 1-bit Adam's and LAMB's whole momentum, LAMB's fresh variance
  b.version = version_bytes_;
  return b;
}

} // namespace dsa::train
