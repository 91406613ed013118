// The host-memory budget of `dsactor run` ([limits] host_memory): a plan made at
// start-up of what the process will hold at its peak, checked against the budget
// before anything large is allocated, and compared with the measured peak at the end.
//
// The plan, for the whole process (its in-process ranks share its memory):
//   baseline      resident bytes when the plan is made (VmRSS: code, libraries, the
//                 vocabulary, rank 0's data provider), plus one more data provider per
//                 further in-process rank (measured: what making rank 0's took)
//   model states  memory_accounting.hpp's bytes per rank and stage, times the ranks
//   activations   an estimate per rank: each stage's stash slots (its schedule's
//                 micro-batches between forward and backward) times its layers'
//                 stash (bert::layer_stash_bytes, equal to a real forward's) and the
//                 embeddings' output, plus one layer's stash of temporaries, the
//                 head's logits and their gradient, and the activation and gradient
//                 messages between stages (2 slots per edge each way)
//   communication with several data-parallel ranks, each rank's reducers hold what
//                 they send and receive of a gradient bucket: 2 x 4 bytes x the smaller
//                 of reduce_bucket_size and the stage's parameters, per stage
//   ZeRO-3        the parts' gathered weights and their whole gradients in flight
//                 (bounded by the stage3_ keys and reduce_bucket_size); at start-up the
//                 stages' whole weights before they are partitioned
//   checkpoint    with ZeRO over several ranks every rank gathers its stages' whole
//                 fp32 masters (4 bytes per parameter; its moments are written from
//                 views); with NVMe offload the partition's masters are read back (4
//                 bytes per partition element) and its moments one swap chunk at a time
//                 (8 bytes per chunk element); without either, a checkpoint reads the
//                 shards' own tensors (nothing more). A checkpoint is written from a step
//                 hook while the stages go on with the next step's forward and backward,
//                 so it counts on top of the activations
//   margin        what the plan does not model (threads' stacks, the allocator's
//                 arenas, CAF's mailboxes, OpenMP): 16 MiB + 10% of the rest
// With the optimizer state on NVMe (zero_optimization.offload_optimizer.device = "nvme")
// the plan fits a budget by itself: smaller sub-groups, then (ZeRO-3) the working weights'
// partitions to NVMe, then (limits.gradient_partition = "auto", Adam/AdamW) ZeRO's gradient
// partition to a file there (core/file_backed.hpp), each only when the earlier moves do
// not fit. The final evaluation is planned apart
// (host_memory_plan::evaluation) and skipped under a budget it would exceed.
#pragma once

#include "actors/train/config/limits_config.hpp"
#include "actors/train/config/run_config.hpp"
#include "core/config.hpp"
#include "core/config_problems.hpp"
#include "core/error.hpp"
#include "models/bert/bert_range.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsa::net {
class rendezvous_client;
}

namespace dsa::train {

class batch_provider;

// A line of /proc/self/status in bytes ("VmRSS", "VmHWM"); 0 when absent.
std::int64_t proc_status_bytes(const char* field);

// What the plan is made from besides the config.
struct plan_inputs {
  std::int64_t baseline = 0;       // resident bytes now
  std::int64_t data_provider = 0;  // bytes one rank's data provider took (counted per further rank)
  std::int64_t seq_length = 128;   // T of a micro-batch
  std::int64_t predictions = 20;   // masked-LM slots per sequence (pre-training)
  bool writes_checkpoints = true;  // the run saves checkpoints (every rank takes part under ZeRO)
  // Stages across processes: [s] whether this process runs stage s (empty: every stage), and
  // whether it gathers the other stages' fp32 masters for the model file (the job's rank 0).
  std::vector<bool> here;
  bool gathers_masters = false;
  bool runs(std::size_t s) const { return here.empty() || here.at(s); }
  // Pre-training shards: what one rank's shard reader holds resident at most (its mapped
  // pages between two releases, data::shard_reader::resident_bound); 0 for other data.
  std::int64_t data_reader = 0;
};

struct host_memory_plan {
  std::int64_t baseline = 0, model_states = 0, activations = 0, communication = 0, checkpoint = 0, margin = 0;
  // ZeRO-3: the parts' gathered weights and their whole gradients in flight (memory_plan.cpp)
  std::int64_t zero3 = 0;
  // ZeRO-3 at start-up: the stages' whole weights exist once before they are partitioned
  // (the gradient partitions not touched yet); what that needs beyond the training's
  // activations, parts in flight, communication and checkpoint staging (usually 0).
  std::int64_t initialization = 0;
  std::int64_t optimizer_in_memory = 0; // of model_states: fp32 masters and moments
  std::int64_t swap_buffers = 0;        // of model_states: NVMe swap buffers
  // of model_states: pipeline.speculative_update's rollback copies (masters, moments, the
  // gradients a step consumes, half masters), allocated on the first speculation
  std::int64_t speculation = 0;
  // The ranks' shard readers: their mapped shard pages between two releases (plan_inputs).
  std::int64_t data_reader = 0;
  // Not part of the peak: what the final evaluation would add, the stages' weights gathered
  // whole and the assembled model's weights and gradients (4 + 4 bytes per parameter) with
  // one rank's activations. At the end of the run the model states are still there, so the
  // evaluation's peak is the baseline, the model states, this and a margin; under a budget
  // it runs only if that fits (evaluation_fits: each process's own view; a job of several
  // processes evaluates only if every one of them fits, trainer.cpp).
  std::int64_t evaluation = 0;
  std::int64_t evaluation_peak() const;
  bool evaluation_fits(const run_config& rc) const;
  std::int64_t peak() const;
  // "planned peak 41.2 MiB = baseline ... + model states ... + activations ... + gradient
  // communication ... + checkpoint staging ... + margin ..."
  std::string describe() const;
};

// The plan at rc's settings (offload and sub_group_size as they are).
host_memory_plan plan_host_memory(const run_config& rc, const std::vector<bert::bert_range>& ranges,
                                  const plan_inputs& in);

// What fits rc.host_memory: the plan as configured; with NVMe offload, the largest
// sub_group_size (a multiple of the flat layout's 2048-element alignment, at most
// the configured one) whose swap buffers fit. An errc::config error naming
// limits.host_memory, the plan's parts and the smallest budget that works when
// nothing fits (and what NVMe offload would need when it is off).
// ZeRO-3 with its working weights on NVMe (offload_param), on CPU ranks: the stage's whole
// weights exist only until they are partitioned into the store, so they are built in a file
// instead of in memory, a tensor resident at a time (core/file_backed.hpp), as DeepSpeed's
// zero.Init builds a model straight into its partitions (run_setup's make_stages).
bool builds_weights_in_file(const run_config& rc);

struct memory_decision {
  host_memory_plan plan;
  std::optional<std::int64_t> sub_group_size; // set when the budget made it smaller
  // ZeRO-3 with the optimizer state on NVMe: the budget also moved the working weights'
  // partitions there (weights_to_nvme), read through buffers of param_buffer_size elements.
  bool weights_to_nvme = false;
  std::int64_t param_buffer_size = 0;
  // limits.gradient_partition "auto": nothing else fitted, so ZeRO's gradient partition
  // goes to NVMe too (rc.grads_on_nvme).
  bool grads_to_nvme = false;
  // ZeRO-3, when even that did not fit: the largest stage3_prefetch_bucket_size that does.
  std::optional<std::int64_t> stage3_prefetch;
};
// ZeRO-3's working-weight partitions swapped to the optimizer swap's nvme_path, none of
// them kept in memory (offload_param device "nvme", max_in_cpu 0, buffer_size as given:
// the buffer_count buffers the partition passes through): what the plan chooses when the
// optimizer state on NVMe is not enough.
void weights_to_nvme(run_config& rc, std::int64_t buffer_size);
// Whether the plan may choose that: ZeRO-3, the optimizer state on NVMe, the weights not.
bool may_move_weights(const run_config& rc);

// A job of several processes, each having planned for itself (plan_run_memory): what
// they must do alike. could_move_weights: may_move_weights before the plan (the same
// in every process). The weights go to NVMe everywhere if any process moved them, every
// process takes the smallest sub_group_size any chose, and the final evaluation runs
// (under a budget) only if it fits in every process (`evaluates`, in and out). Every
// process calls it at the same point; the rendezvous's allgathers carry the answers.
status agree_on_memory(net::rendezvous_client& client, run_config& rc, bool could_move_weights, bool& evaluates);
expected<memory_decision> fit_host_memory(const run_config& rc, const std::vector<bert::bert_range>& ranges,
                                          const plan_inputs& in);

// The run's start-up: plans (logging the plan), refuses what does not fit, applies a
// smaller sub_group_size to rc; a micro-batch of a copy of `data` gives the sequence and
// prediction lengths. rss_before_data: VmRSS before make_provider.
// here, gathers_masters: plan_inputs' (stages across processes: this process's stages).
// used: where the inputs the plan was made from are left (the device plan's micro-batch).
expected<host_memory_plan> plan_run_memory(run_config& rc, const batch_provider& data, std::int64_t rss_before_data,
                                           const std::vector<bool>& here = {}, bool gathers_masters = false,
                                           plan_inputs* used = nullptr);
// limits.host_memory caps the process's pinned memory too (core/pinned_memory.hpp): pinned
// pages count in the resident set, and past the cap a block is pageable instead.
void cap_pinned_memory(const run_config& rc);
// The end of the run: planned peak vs VmHWM and the tensors' peak, one log line.
void log_memory_report(const run_config& rc, const host_memory_plan& plan);

} // namespace dsa::train
