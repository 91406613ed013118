// Metrics, progress and checkpoints after each step.
#include "actors/train/run/step_reporter.hpp"
#include "actors/train/stage/step_stats.hpp"

#include "actors/train/memory/memory_accounting.hpp"

#include "actors/train/config/layer_partition.hpp"
#include "actors/train/run/run_checkpoint.hpp"
#include "core/log.hpp"
#include "io/ckpt/checkpoint_dir.hpp"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

namespace dsa::train {

bool checkpoint_due(const run_config& rc, std::uint32_t step) {
  const auto& cp = rc.checkpoint;
  return cp.save_interval > 0 && (step + 1) % static_cast<std::uint32_t>(cp.save_interval) == 0;
}

void step_reporter::on_step(const actors::step_summary& s) {
  const std::uint32_t step = s.step;
  if (!states_measured_) {
    states_measured_ = true;
    // After the first update every model-state buffer exists: compare with the accounting.
    for (std::uint32_t st = 0; st < in_.rc.stages; ++st) {
      if (!shards_[st]) continue; // another process's stage (it runs no reporter)
      const auto measured = train::measured_model_states(*model_.stages[st], *shards_[st]);
      auto expected = expected_model_states(model_.stages[st]->named_parameters().count(), in_.rc.working,
                                            run_zero_sizes(in_.rc, model_.ranges, st));
      // The GPU-resident optimizer keeps its masters and moments on the device, not here
      // (the device's own line reports them; debug.host_optimizer_device keeps them here).
      if (in_.device.device == stage_device::cuda && in_.rc.offload.device == offload_device::none &&
          !in_.rc.host_optimizer_device)
        expected.masters = expected.half_masters = expected.moments = 0;
      if (measured == expected)
        log_info("stage {}: model states measured after the first step: {} (as expected)", st, measured.describe());
      else
        log_warn("stage {}: model states measured after the first step: {}; the accounting expected {}", st,
                 measured.describe(), expected.describe());
    }
  }
  // Every shard decided the same; shard 0's decision stands for all (rank 0 runs stage 0).
  const step_decision& d = shards_.front()->last_decision();
  const step_totals t = step_totals_of(s.metrics);
  auto now = std::chrono::steady_clock::now();
  double secs = std::chrono::duration<double>(now - last_).count();
  last_ = now;
  const auto& b = in_.rc.batch;
  const std::int64_t samples = static_cast<std::int64_t>(step + 1) * b.train_batch_size;
  metrics_row row{static_cast<std::int64_t>(step) + 1, samples, {}};
  row.values = {{"Train/Samples/train_loss", t.mean_loss()},
                {"Train/Samples/lr", d.lr_after},
                {"Train/Samples/loss_scale", d.loss_scale_after},
                {"Train/Samples/grad_norm", std::sqrt(s.grad_sum_of_squares) / d.loss_scale},
                {"Train/Samples/skipped", d.skip ? 1.0 : 0.0}};
  if (t.mlm_count > 0)
    row.values.push_back({"Train/Samples/mlm_accuracy",
                          static_cast<double>(t.mlm_correct) / static_cast<double>(t.mlm_count)});
  if (t.nsp_count > 0)
    row.values.push_back({"Train/Samples/nsp_accuracy",
                          static_cast<double>(t.nsp_correct) / static_cast<double>(t.nsp_count)});
  step_times times;
  if (in_.rc.wall_clock_breakdown) {
    times = take_times(s);
    // DeepSpeed's monitor names for the wall_clock_breakdown timers, plus the whole step's wall time.
    row.values.push_back({"Train/Samples/elapsed_time_ms_forward", times.forward_ms});
    row.values.push_back({"Train/Samples/elapsed_time_ms_backward", times.backward_ms});
    row.values.push_back({"Train/Samples/elapsed_time_ms_step", times.step_ms});
    row.values.push_back({"Train/Samples/elapsed_time_ms_iteration", secs * 1e3});
  }
  if (auto w = metrics_.write(row); !w)
    throw std::runtime_error(w.err().message);
  last_loss_ = t.mean_loss();
  step_report r;
  r.step = static_cast<std::int64_t>(step) + 1;
  r.loss = t.mean_loss();
  r.lr = d.lr_after;
  r.loss_scale = d.loss_scale_after;
  r.samples_per_s = secs > 0 ? static_cast<double>(b.train_batch_size) / secs : 0.0;
  if (in_.rc.wall_clock_breakdown)
    r.extra = fmt::format("forward {:.1f} ms | backward {:.1f} ms | step {:.1f} ms (summed over stages)",
                          times.forward_ms, times.backward_ms, times.step_ms);
  bar_.update(r);
  if (checkpoint_due(in_.rc, step))
    save(step, s.data_position);
}

void step_reporter::save(std::uint32_t step, const std::vector<std::uint64_t>& data_position) {
  if (data_position.empty())
    throw std::runtime_error(fmt::format("checkpoint of step {}: the feeder sent no data position", step + 1));
  // With ZeRO over several ranks every rank writes its own optimizer partition (staged),
  // the masters are gathered into the model file, and this save commits them together.
  std::vector<state_payload> payloads;
  std::vector<ckpt::checkpoint_file> staged;
  for (std::uint32_t st = 0; st < shards_.size(); ++st) {
    const model_shard* shard = shards_[st];
    if (!shard) { // another process's stage: its owner sends its part
      DSA_CHECK(remote_part_, "checkpoint: stage {} runs in another process and nobody fetches its state", st);
      auto part = remote_part_(st);
      payloads.push_back(std::move(part.payload));
      staged.insert(staged.end(), part.staged.begin(), part.staged.end());
      continue;
    }
    if (shard->saves_errors()) { // every rank's 1-bit error buffers in its own file
      auto files = shard->stage_errors(in_.rc.checkpoint.dir, std::uint64_t{step} + 1);
      staged.insert(staged.end(), files.begin(), files.end());
    }
    if (!shard->per_rank_checkpoint()) {
      payloads.push_back(shard->payload());
      continue;
    }
    payloads.push_back(shard->gathered_masters());
    if (shard->streams_masters()) staged.push_back(shard->stage_masters(in_.rc.checkpoint.dir, std::uint64_t{step} + 1));
    auto files = shard->stage_partition(in_.rc.checkpoint.dir, std::uint64_t{step} + 1);
    staged.insert(staged.end(), files.begin(), files.end());
  }
  const step_decider& decider = shards_.front()->decider();
  run_progress_state p;
  p.next_step = step + 1;
  p.schedule_iteration = decider.schedule_iteration();
  p.scaler = decider.scaler_state();
  p.data_cursor = data_position;
  p.skipped_steps = decider.skipped();
  p.stages = in_.rc.stages;
  p.layout = describe_layout(model_.ranges);
  p.precision = precision_name(in_.rc.working);
  p.micro_batch_size = in_.rc.batch.micro_batch_size;
  p.gradient_accumulation = in_.rc.batch.gradient_accumulation;
  p.data_parallel_size = in_.rc.batch.data_parallel_size;
  p.config_toml = in_.cfg.to_toml();
  ckpt::checkpoint_contents c;
  c.step = step + 1;
  c.global_samples = static_cast<std::uint64_t>(step + 1) *
                     static_cast<std::uint64_t>(in_.rc.batch.train_batch_size);
  c.state = progress_to_json(p);
  c.groups = checkpoint_groups(payloads);
  for (const auto& f : staged) // a model file a shard streamed replaces the (empty) gathered one
    if (f.group == "model") c.groups.erase("model");
  ckpt::save_options o;
  o.keep_last = static_cast<std::size_t>(in_.rc.checkpoint.keep_last);
  o.overwrite = ckpt::overwrite_policy::replace;
  o.staged = std::move(staged);
  auto saved = ckpt::save_checkpoint(in_.rc.checkpoint.dir, c, o);
  if (!saved)
    throw std::runtime_error("checkpoint: " + saved.err().message);
  bar_.finish();
  last_saved_ = step;
  log_info("saved checkpoint {} (step {})", saved->dir, step + 1);
}

step_reporter::step_times step_reporter::take_times(const actors::step_summary& s) {
  const std::vector<double> ms = s.figures.size() == 3 ? s.figures : take_stage_times(model_.shared, s.step);
  return {ms[0], ms[1], ms[2]};
}

} // namespace dsa::train
