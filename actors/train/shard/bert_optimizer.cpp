// One stage's optimizer shard.
#include "actors/train/shard/bert_optimizer.hpp"

#include "actors/data_parallel.hpp"
#include "core/log.hpp"
#include "optim/grad_clip.hpp"
#include "io/aio/swap_store.hpp"
#include "optim/partition_checkpoint.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace dsa::train {

bert_optimizer::bert_optimizer(bert_optimizer_options options) : options_(std::move(options)) {
  DSA_CHECK(options_.decider != nullptr, "optimizer shard {}: no step decider", options_.participant);
  if (options_.offload) swap_tracer_ = std::make_shared<swap_tracer>();
}

void bert_optimizer::init(const std::vector<tensor>& initial) {
  const auto& specs = options_.specs;
  DSA_CHECK(initial.size() == specs.size(), "optimizer shard {}: {} initial tensors for {} parameters",
            options_.participant, initial.size(), specs.size());
  if (options_.zero_ranks > 1 || options_.offload || options_.partition_parameters) return init_partitioned(initial);
  if (options_.optimizer.compressed()) return init_compressed(initial);
  dtype half = working_dtype(options_.working);
  slots_.clear();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    optim::param_slot s;
    s.name = specs[i].name;
    auto resumed = options_.resume_masters.find(s.name);
    if (!options_.resume_masters.empty()) {
      if (resumed == options_.resume_masters.end())
        throw std::runtime_error("checkpoint has no master weights for " + s.name);
      s.param = cast_to(resumed->second, dtype::f32);
    } else {
      s.param = cast_to(initial[i], dtype::f32);
    }
    s.grad = tensor::zeros(s.param.shape(), dtype::f32);
    if (half != dtype::f32) s.half_copy = cast_to(s.param, half);
    slots_.push_back(s);
  }
  // Groups hold copies of the slots: tensors are shared, so updates land in slots_ too.
  auto groups = optim::bert_param_groups(slots_, options_.optimizer.weight_decay, options_.optimizer.lr);
  auto created = optim::optimizer::create(options_.optimizer, std::move(groups));
  if (!created) throw std::runtime_error(created.err().message);
  opt_.emplace(std::move(*created));
  if (options_.resume_state) {
    auto loaded = opt_->load_state(*options_.resume_state);
    if (!loaded) throw std::runtime_error(loaded.err().message);
  }
}

namespace {
// Tensor i of the layout as a view of a flat buffer, in its own shape.
tensor layout_view(const tensor& flat, const optim::flat_tensor& t) {
  return flat.slice_rows(t.offset, t.offset + t.numel).reshape(t.shape);
}
} // namespace

expected<optim::flat_layout> stage_flat_layout(const std::vector<bert::param_spec>& specs, std::uint32_t ranks) {
  std::vector<optim::flat_tensor_spec> flat;
  for (const auto& s : specs) flat.push_back(optim::bert_flat_tensor(s.name, s.shape));
  return optim::flat_layout::create(std::move(flat), ranks);
}

void bert_optimizer::init_partitioned(const std::vector<tensor>& initial) {
  const auto& specs = options_.specs;
  DSA_CHECK((options_.peers || options_.zero_ranks == 1) && options_.zero_rank < options_.zero_ranks,
            "optimizer shard {}: ZeRO rank {} of {} without its peers", options_.participant, options_.zero_rank,
            options_.zero_ranks);
  auto layout = stage_flat_layout(specs, options_.zero_ranks);
  if (!layout) throw std::runtime_error(layout.err().message);
  auto create = [&]() -> expected<optim::partitioned_optimizer> {
    std::unique_ptr<optim::chunked_state> store; // none: in memory
    if (const auto& off = options_.offload) {
      aio::swap_options so;
      so.dir = off->dir;
      so.name = fmt::format("stage{}", options_.participant);
      so.numel = layout->partition_numel();
      so.sub_group = off->sub_group;
      so.granule = layout->alignment();
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
      DSA_ASSIGN_OR_RETURN(auto state, index.partition(*layout, options_.zero_rank));
      return optim::partitioned_optimizer::create(options_.optimizer, *layout, options_.zero_rank, std::move(state),
                                                  std::move(store));
    }
    DSA_CHECK(options_.resume_masters.empty() && !options_.resume_state,
              "optimizer shard {}: a partitioned shard resumes from resume_partitions", options_.participant);
    return optim::partitioned_optimizer::create(options_.optimizer, *layout, options_.zero_rank, initial,
                                                std::move(store));
  };
  auto created = create();
  if (!created) throw std::runtime_error(created.err().message);
  part_.emplace(std::move(*created));
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
  if (options_.optimizer.compressed()) init_onebit_partition();
}

std::vector<tensor> bert_optimizer::gradient_buffers() {
  std::vector<tensor> out;
  if (part_ && options_.partition_gradients) {
    // Each tensor's piece of this rank's partition, as a view of flat_grad_ (1-D, maybe empty).
    const auto parts = gradient_parts();
    const auto& tensors = part_->layout().tensors();
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
  if (part_) {
    for (const auto& t : part_->layout().tensors()) out.push_back(layout_view(flat_grad_, t));
    return out;
  }
  for (const auto& s : slots_) out.push_back(s.grad);
  return out;
}

std::vector<actors::gradient_part> bert_optimizer::gradient_parts() {
  if (!part_ || !options_.partition_gradients) return {};
  const auto& layout = part_->layout();
  std::vector<actors::gradient_part> parts(layout.tensors().size());
  for (const auto& p : layout.pieces(part_->partition()))
    parts[p.tensor] = {p.tensor_offset, p.tensor_offset + p.count};
  if (options_.whole_gradient >= 0)
    parts[static_cast<std::size_t>(options_.whole_gradient)] = {0, whole_grad_.numel()};
  return parts;
}

// This rank's partition of the reduced gradients. ZeRO stage 2 copies the owned piece
// of the whole (tied) gradient in first: the reducer summed it with the other stage's.
tensor bert_optimizer::partition_grad() {
  const optim::flat_range mine = part_->partition();
  if (!options_.partition_gradients) return flat_grad_.slice_rows(mine.lo, mine.hi);
  if (whole_grad_.defined())
    for (const auto& p : part_->layout().pieces(mine))
      if (static_cast<int>(p.tensor) == options_.whole_gradient)
        flat_grad_.slice_rows(p.flat_offset - mine.lo, p.flat_offset - mine.lo + p.count)
            .copy_from(whole_grad_.flatten().slice_rows(p.tensor_offset, p.tensor_offset + p.count));
  return flat_grad_;
}

bool bert_optimizer::update(std::uint32_t step, const actors::grad_totals& totals, std::vector<tensor>& out) {
  auto started = std::chrono::steady_clock::now();
  if (options_.fail_step >= 0 && step == static_cast<std::uint64_t>(options_.fail_step))
    throw std::runtime_error("injected fault (debug.fail_optimizer_step)");
  const step_decision would = options_.decider->assume(); // what a stream of the step assumes
  // A compressed optimizer's local step: the rank's own norms, an overflow anywhere skips everywhere.
  const step_decision d =
      options_.decider->decide(step, local_next() ? local_totals(totals) : totals);
  last_differed_ = !step_decider::same_update(would, d);
  const bool speculated = speculated_step_ && *speculated_step_ == step;
  DSA_CHECK(!speculated_step_ || speculated, "optimizer shard {}: update of step {} after speculating on step {}",
            options_.participant, step, *speculated_step_);
  speculated_step_.reset();
  const bool streamed = streamed_step_ && *streamed_step_ == step;
  DSA_CHECK(!streamed_step_ || streamed, "optimizer shard {}: update of step {} after streaming step {}",
            options_.participant, step, *streamed_step_);
  streamed_step_.reset();
  const bool stream_kept = streamed && settle_stream(step, d);
  const bool kept = speculated && step_decider::same_update(assumed_, d);
  if (speculated && !kept) {
    roll_back(); // clipped or overflowed: as if the speculation had not run
    ++rolled_back_;
  }
  if (kept && swap_)
    if (auto s = swap_->commit_shadow(); !s)
      throw std::runtime_error(fmt::format("ZeRO update of stage {}: {}", options_.participant, s.err().message));
  if (!kept && !stream_kept) advance(step, d);
  publish(d, out);
  if (options_.update_ns)
    *options_.update_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count();
  return !d.skip;
}

void bert_optimizer::advance(std::uint32_t step, const step_decision& d) {
  if (part_) {
    if (swap_) swap_tracer_->update_begins(step, swap_->sweeps() + 1);
    status s = options_.fetcher ? advance_into_fetcher(d) : advance_partition(d, {});
    if (swap_) swap_tracer_->update_ends(swap_->sweeps());
    if (!s) throw std::runtime_error(fmt::format("ZeRO update of stage {}: {}", options_.participant, s.err().message));
    return;
  }
  if (d.skip) return;
  if (comp_) {
    std::optional<std::pair<double, double>> betas;
    if (d.set_betas) betas = std::pair{d.beta1, d.beta2};
    if (auto s = comp_->step(d.lr, d.grad_scale, betas); !s)
      throw std::runtime_error(fmt::format("{} of stage {}: {}", optim::optimizer_name(options_.optimizer.type),
                                           options_.participant, s.err().message));
    for (auto& s : slots_)
      if (s.half_copy.defined()) cast_into(s.half_copy, s.param, s.half_copy.type());
    return;
  }
  for (auto& s : slots_) optim::scale_in_place(s.grad, d.grad_scale);
  opt_->set_lr(d.lr);
  if (d.set_betas) opt_->set_betas(d.beta1, d.beta2);
  opt_->step();
}

// ZeRO-3: the new version goes into the fetcher's store as it is computed: in place when
// the store keeps the partition in memory, else window by window (to NVMe).
status bert_optimizer::advance_into_fetcher(const step_decision& d) {
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

std::int64_t bert_optimizer::version_window() const {
  return std::min<std::int64_t>(part_->layout().partition_numel(), version_window_elements);
}

// The partition's update (or, for a skipped step, its working weights from the masters)
// into `working`: the given tensor, flat_working_ (undefined and no sink), or the sink.
status bert_optimizer::advance_partition(const step_decision& d, tensor working, const optim::working_sink& sink) {
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
  if (zchannel_) return advance_onebit_partition(d, working);
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
expected<std::vector<double>> bert_optimizer::sum_over_ranks(const std::vector<double>& partial) const {
  const auto ranks = static_cast<std::uint32_t>(options_.peers->size());
  std::vector<double> all(partial.size() * ranks);
  DSA_TRY(actors::log_collective(options_.logger, "all_gather", static_cast<std::int64_t>(all.size()) * 8,
                                 shard_name(), [&] {
                                   return options_.peers->allgather(all.data(), partial.data(), dtype::i64,
                                                                    static_cast<std::int64_t>(all.size()));
                                 }));
  return optim::partitioned_optimizer::add_gathered(all, ranks);
}

void bert_optimizer::publish(const step_decision& d, std::vector<tensor>& out) {
  if (part_) {
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
      if (!working_whole_)
        gather_flat(flat_working_, flat_working_.slice_rows(mine.lo, mine.hi), "updated weights");
      working_whole_ = false; // each update says again
      for (const auto& t : part_->layout().tensors()) out.push_back(layout_view(flat_working_, t));
    }
  } else {
    write_working(out);
  }
  out.push_back(loss_scale_tensor(d.loss_scale_after)); // the next step's, for the stage's backward
  last_ = d;
}

void bert_optimizer::gather_flat(const tensor& all, const tensor& mine, const char* what) const {
  if (options_.zero_ranks == 1) {
    if (all.raw_data() != mine.raw_data()) std::memcpy(all.raw_data(), mine.raw_data(), mine.nbytes());
    return;
  }
  if (auto g = actors::log_collective(options_.logger, "all_gather", static_cast<std::int64_t>(all.nbytes()), shard_name(),
                                      [&] { return options_.peers->allgather(all.raw_data(), mine.raw_data(), all.type(), all.numel()); });
      !g)
    throw std::runtime_error(fmt::format("gathering stage {}'s {} from the other ranks: {}", options_.participant, what,
                                         g.err().message));
}

void bert_optimizer::write_working(std::vector<tensor>& out) {
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

void bert_optimizer::trace_attach(actors::trace_recorder* trace, std::uint32_t actor, std::int32_t stage) {
  if (swap_tracer_) swap_tracer_->attach(trace, actor, stage);
}

void bert_optimizer::trace_detach() {
  if (!swap_tracer_) return;
  if (swap_) swap_->wait_idle(); // the last step's writes and the next step's prefetch end
  swap_tracer_->detach();
}

std::string bert_optimizer::swap_report() const {
  if (!swap_) return {};
  const aio::swap_stats s = swap_->stats();
  const double moved = static_cast<double>(s.bytes_read + s.bytes_written);

  const std::uint64_t gradient_wait = s.gate_ns;
  const double swept_s = static_cast<double>(s.wait_ns + s.compute_ns) * 1e-9;
  std::string streamed =
      streamed_ > 0 ? fmt::format("; {} updates streamed over the backward: {} of their {} chunk updates began before "
                                  "the step's last gradients were in, {:.3f} s waited for gradients",
                                  streamed_, early_chunks_, streamed_chunks_, static_cast<double>(gradient_wait) * 1e-9)
                    : std::string();
  if (streamed_ + stream_declined_ > 0 && options_.decider->needs_totals())
    streamed += fmt::format("; clipping: {} streamed updates redone after the norm, {} steps not streamed after a "
                            "clipped one", stream_redone_, stream_declined_);
  return fmt::format("stage {} NVMe swap: read {:.1f} MiB ({} chunk reads, {} of them prefetched before their update), "
                     "wrote {:.1f} MiB ({} chunk writes); the updates waited {:.3f} s for I/O and computed {:.3f} s "
                     "({:.1f}% waiting); {:.2f} GB/s achieved over {:.3f} s with a transfer in flight{}",
                     options_.participant, static_cast<double>(s.bytes_read) / (1 << 20), s.chunk_reads,
                     s.chunks_prefetched, static_cast<double>(s.bytes_written) / (1 << 20), s.chunk_writes,
                     static_cast<double>(s.wait_ns) * 1e-9, static_cast<double>(s.compute_ns) * 1e-9,
                     swept_s > 0 ? 100 * static_cast<double>(s.wait_ns) * 1e-9 / swept_s : 0.0,
                     s.busy_ns > 0 ? moved / static_cast<double>(s.busy_ns) : 0.0,
                     static_cast<double>(s.busy_ns) * 1e-9, streamed);
}

shard_bytes bert_optimizer::held_bytes() const {
  shard_bytes b;
  if (part_) {
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
  for (const auto& s : slots_) {
    b.gradients += static_cast<std::int64_t>(s.grad.nbytes());
    b.masters += static_cast<std::int64_t>(s.param.nbytes());
    if (s.half_copy.defined()) b.half_masters += static_cast<std::int64_t>(s.half_copy.nbytes());
  }
  // The moments live in the optimizer's own slots (it allocates them).
  if (comp_) b.moments = 2 * b.masters;
  if (opt_)
    for (const auto& g : opt_->groups())
      for (const auto& s : g.params) b.moments += static_cast<std::int64_t>(s.m.nbytes() + s.v.nbytes());
  b.version = version_bytes_;
  return b;
}

} // namespace dsa::train
