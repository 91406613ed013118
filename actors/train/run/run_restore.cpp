// Resuming one rank from checkpoint.load; see run_restore.hpp.
#include "actors/train/run/run_restore.hpp"

#include "actors/train/config/layer_partition.hpp"
#include "actors/train/run/run_checkpoint.hpp"
#include "actors/train/shard/lamb_resume.hpp"
#include "actors/train/shard/shard_options.hpp"
#include "core/log.hpp"
#include "io/ckpt/checkpoint_dir.hpp"
#include "models/bert/bert_state.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace dsa::train {
namespace {

// A compressed optimizer's 1-bit error buffers: this rank's own file of each stage, when
// the checkpoint was saved on as many ranks and checkpoint.load_error_feedback is on;
// otherwise they start at zero (DeepSpeed's behaviour), which rank 0 says.
status restore_error_buffers(const run_inputs& in, const ckpt::checkpoint_manifest& listed,
                             const run_progress_state& progress, restored& r) {
  const auto& rc = in.rc;
  r.error_states.assign(rc.stages, {});
  if (r.lamb_states.size() != rc.stages) r.lamb_states.assign(rc.stages, {});
  if (!rc.optimizer.compressed()) return {};
  // 1-bit LAMB's replicated state beside the ZeRO partitions: any rank count and stage,
  // whatever load_error_feedback says (it is optimizer state, not error feedback). On
  // another layout restore_lamb_by_name has cut it for the new stages.
  if (!r.repartitioned) {
    ckpt::load_options lamb;
    for (std::uint32_t s = 0; s < rc.stages; ++s)
      for (const auto& f : listed.files)
        if (f.group == checkpoint_lamb_group(s)) lamb.groups.push_back(f.group);
    if (!lamb.groups.empty()) {
      DSA_ASSIGN_OR_RETURN(auto ck, ckpt::load_checkpoint_dir(r.dir, lamb));
      for (std::uint32_t s = 0; s < rc.stages; ++s)
        if (auto it = ck.groups.find(checkpoint_lamb_group(s)); it != ck.groups.end())
          r.lamb_states[s] = std::move(it->second);
    }
  }
  if (rc.batch.data_parallel_size < 2) return {};
  std::string why;
  if (!rc.checkpoint.load_error_feedback) why = "checkpoint.load_error_feedback = false";
  else if (r.repartitioned)
    why = "saved with another pipeline layout: a buffer covers a stage's parameters and its ranks' chunks";
  else if (progress.data_parallel_size != rc.batch.data_parallel_size)
    why = fmt::format("saved on {} ranks, this run has {}", progress.data_parallel_size, rc.batch.data_parallel_size);
  ckpt::load_options lo;
  for (std::uint32_t s = 0; s < rc.stages && why.empty(); ++s) {
    const std::string group = checkpoint_errors_group(s, static_cast<std::uint32_t>(in.rank));
    for (const auto& f : listed.files)
      if (f.group == group) lo.groups.push_back(group);
  }
  if (why.empty() && lo.groups.size() != rc.stages) why = "the checkpoint holds no error buffers for this rank";
  if (!why.empty()) {
    if (in.rank == 0) log_info("1-bit error buffers start at zero ({})", why);
    return {};
  }
  DSA_ASSIGN_OR_RETURN(auto ck, ckpt::load_checkpoint_dir(r.dir, lo));
  for (std::uint32_t s = 0; s < rc.stages; ++s)
    r.error_states[s] = std::move(ck.groups.at(checkpoint_errors_group(s, static_cast<std::uint32_t>(in.rank))));
  return {};
}

// 1-bit LAMB's per-tensor state on another pipeline layout: each saved stage's (its ZeRO
// group, or its whole shard's optimizer group in `ck`) keyed by name, then cut for each new
// local stage (lamb_resume.hpp); the whole shards' group entries leave the merged state.
status restore_lamb_by_name(const run_inputs& in, const rank_model& m, const ckpt::checkpoint_manifest& listed,
                            const ckpt::loaded_checkpoint& ck, const run_progress_state& progress, restored& r) {
  const auto& rc = in.rc;
  r.lamb_states.assign(rc.stages, {});
  if (rc.optimizer.type != optim::optimizer_type::onebit_lamb) return {};
  DSA_ASSIGN_OR_RETURN(auto saved_ranges, parse_layout(progress.layout, rc.model));
  if (saved_ranges.size() != progress.stages)
    return make_error(errc::format, "{}: the saved layout '{}' has {} stages, the checkpoint says {}", ck.dir,
                      progress.layout, saved_ranges.size(), progress.stages);
  std::vector<saved_lamb_stage> saved(saved_ranges.size());
  for (std::uint32_t k = 0; k < saved.size(); ++k) {
    saved[k].specs = bert::parameter_specs(rc.model, saved_ranges[k]);
    const std::string group = checkpoint_lamb_group(k);
    const bool zero_group = std::any_of(listed.files.begin(), listed.files.end(),
                                        [&](const auto& f) { return f.group == group; });
    if (zero_group) {
      ckpt::load_options lo;
      lo.groups = {group};
      DSA_ASSIGN_OR_RETURN(auto one, ckpt::load_checkpoint_dir(r.dir, lo));
      saved[k].lamb_state = std::move(one.groups.at(group));
      continue;
    }
    auto opt = ck.groups.find(fmt::format("optimizer_{}", k));
    if (opt == ck.groups.end())
      return make_error(errc::format, "{}: no 1-bit LAMB state for saved stage {} (group {} or optimizer_{})", ck.dir,
                        k, group, k);
    DSA_ASSIGN_OR_RETURN(saved[k].lamb_state, lamb_state_of_group(saved[k].specs, opt->second));
    if (saved[k].lamb_state.empty())
      return make_error(errc::format, "{}: group optimizer_{} holds no 1-bit LAMB state", ck.dir, k);
  }
  for (std::uint32_t s = 0; s < rc.stages; ++s) {
    if (!m.stages[s]) continue; // another process's stage
    auto cut = repartition_lamb_state(saved, bert::parameter_specs(rc.model, m.ranges[s]));
    if (!cut) return make_error(cut.err().code, "{}: stage {}: {}", ck.dir, s, cut.err().message);
    r.lamb_states[s] = std::move(*cut);
    auto& merged = r.optimizer_states[s].tensors;
    for (auto it = merged.begin(); it != merged.end();)
      it = it->first.rfind("compressed.", 0) == 0 ? merged.erase(it) : std::next(it);
  }
  return {};
}

} // namespace

bool partitioned(const run_config& rc) {
  return (rc.zero_stage >= 1 && rc.batch.data_parallel_size > 1) || rc.offload.swaps();
}

expected<restored> restore(run_inputs& in, rank_model& m, const std::string& which) {
  const bool parts = partitioned(in.rc);
  DSA_ASSIGN_OR_RETURN(std::string dir, ckpt::resolve_checkpoint(in.rc.checkpoint.dir, which));
  DSA_ASSIGN_OR_RETURN(auto listed, ckpt::read_checkpoint_manifest(dir));
  DSA_ASSIGN_OR_RETURN(auto saved, progress_from_json(listed.state, dir));
  // Another pipeline layout (other stages or partition): the model is HuggingFace-named, and
  // the optimizer state is named by parameter too (whole tensors, or ZeRO's and the NVMe
  // swap's pieces by tensor range), so each new stage takes its parameters' state from
  // whichever saved stage held them (a repartition on load).
  const std::string layout = describe_layout(m.ranges);
  const bool repartition = saved.stages != in.rc.stages || saved.layout != layout;
  // Whole groups are read whole (checksummed); ZeRO's per-rank files by range later.
  ckpt::load_options lo;
  lo.groups = {"model"};
  // Under a host budget with partitioned state the model file is mapped, not read: the
  // stages load it a tensor at a time and page each out (the shards read their own files).
  lo.map = parts && in.rc.host_memory > 0;
  const std::uint32_t read_stages = repartition ? saved.stages : in.rc.stages;
  for (std::uint32_t s = 0; s < read_stages && !parts; ++s)
    for (const auto& f : listed.files)
      if ((repartition || in.local(s)) && f.group == fmt::format("optimizer_{}", s)) lo.groups.push_back(f.group);
  DSA_ASSIGN_OR_RETURN(auto ck, ckpt::load_checkpoint_dir(dir, lo));
  DSA_ASSIGN_OR_RETURN(auto progress, progress_from_json(ck.manifest.state, ck.dir));
  // The run must continue the saved one: same precision and micro-batching.
  if (repartition && in.rank == 0 && in.process == 0)
    log_info("{}: saved with the pipeline layout '{}'; repartitioned on load to '{}'", ck.dir, progress.layout, layout);
  if (progress.precision != precision_name(in.rc.working))
    return make_error(errc::config, "{}: saved in {}; this run is {} (fp16.enabled, bf16.enabled)", ck.dir,
                      progress.precision, precision_name(in.rc.working));
  // The data continues where the saved run's global batches ended: the micro-batch and
  // the global batch must match; how a step's micro-batches split into accumulation
  // steps and ranks may change (every rank holds the whole state).
  const auto& b = in.rc.batch;
  if (progress.micro_batch_size != b.micro_batch_size ||
      progress.micro_batch_size * progress.gradient_accumulation * progress.data_parallel_size != b.train_batch_size)
    return make_error(errc::config,
                      "{}: saved with batches of {} = micro-batches of {} x {} accumulation steps x {} ranks; this "
                      "run has {} = {} x {} x {} (train_batch_size, train_micro_batch_size_per_gpu, "
                      "gradient_accumulation_steps, devices.ranks)",
                      ck.dir, progress.micro_batch_size * progress.gradient_accumulation * progress.data_parallel_size,
                      progress.micro_batch_size, progress.gradient_accumulation, progress.data_parallel_size,
                      b.train_batch_size, b.micro_batch_size, b.gradient_accumulation, b.data_parallel_size);
  auto model = ck.groups.find("model");
  if (model == ck.groups.end()) return make_error(errc::format, "{}: no model weights", ck.dir);
  restored r;
  r.dir = ck.dir;
  r.manifest = ck.manifest;
  r.optimizer_states.resize(in.rc.stages);
  r.repartitioned = repartition;
  // Repartitioning: every saved stage's state in one map by name (a tied weight's copies agree).
  optim::optimizer_state all_saved;
  if (repartition)
    for (std::uint32_t k = 0; k < progress.stages; ++k) {
      DSA_ASSIGN_OR_RETURN(auto st, optimizer_state_of(ck, k));
      all_saved.step = std::max(all_saved.step, st.step);
      all_saved.tensors.merge(st.tensors);
    }
  for (std::uint32_t s = 0; s < in.rc.stages; ++s) {
    if (!m.stages[s]) continue; // another process's stage: it restores its own
    auto loaded = bert::load_state(m.stages[s]->named_parameters(), model->second, {});
    if (!loaded) return make_error(errc::format, "{}: model: {}", ck.dir, loaded.err().message);
    if (parts) continue;
    if (repartition) {
      r.optimizer_states[s] = all_saved;
    } else {
      DSA_ASSIGN_OR_RETURN(r.optimizer_states[s], optimizer_state_of(ck, s));
    }
  }
  if (repartition && in.rc.optimizer.compressed()) DSA_TRY(restore_lamb_by_name(in, m, listed, ck, progress, r));
  DSA_TRY(restore_error_buffers(in, listed, progress, r));
  if (!parts) r.masters = std::move(model->second);
  in.first_step = static_cast<std::uint32_t>(progress.next_step);
  DSA_TRY(m.provider->seek(progress.data_cursor));
  r.progress = std::move(progress);
  if (in.rank == 0) log_info("resumed from {} at step {}", ck.dir, in.first_step);
  return r;
}

} // namespace dsa::train
