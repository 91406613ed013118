// What one rank holds for the model states of a stage, in bytes: the expected
// figure from the parameter count (printed at the start of a run) and the measured
// one from the tensors the stage and its optimizer shard hold (printed after the
// first step). The two must agree; a test checks that they do.
//
// Per parameter of the stage (Ψ of them), with w = 4 bytes in fp32 and 2 in fp16/bf16:
//   working weights (stage)                          w
//   gradient accumulators (stage, f32)               4
//   reduced gradients (the shard's f32 buffers)      4
//   fp32 master weights (shard)                      4
//   half copy of the masters (shard, fp16/bf16)      2 (0 in fp32)
//   Adam/LAMB moments (shard, f32)                   8
//   the next parameter version (params slot)         w
// = 28Ψ in fp32, 26Ψ in fp16/bf16. With ZeRO stage 1 over n ranks the shard holds the
// masters and moments of its partition only (12 bytes per partition element, about
// Ψ/n) and no half copy, while the reduced gradients and the next version cover the
// stage's padded flat layout (optim::flat_layout): w + 4 + 4 + 12/n + w per parameter,
// up to padding. ZeRO stage 2 keeps the reduced gradients of the partition only too:
// w + 4 + 16/n + w, except that the first and last stage of a pipeline that ties the
// word embedding keep that parameter's reduced gradient whole as well (4 bytes per
// element of it), since their reducers add the two stages' gradients of it whole. On one
// pipeline stage, stage 2 sums each micro-batch's gradients into the partition (as stage 3
// does), so the stage's accumulators are 4/n too: w + 20/n + w.
// ZeRO stage 3 partitions the working weights too: the stage holds its partition and the
// small persistent tensors whole (w x (Ψ/n + persistent)), and the next version is the
// partition (w/n): w/n + 4 + 16/n + w/n, plus the layers gathered while they run
// (transient, bounded by stage3_max_live_parameters, reported by the fetcher).
// DeepSpeed's ZeRO stage 0 counts 16Ψ for mixed
// precision (2Ψ fp16 weights + 2Ψ fp16 gradients + 12Ψ fp32 masters and moments): it
// keeps fp16 gradients, reduces them in place and has the optimizer write the
// weights directly, where dsactor's stage and shard are separate actors with their
// own buffers (the price of their independence; ZeRO partitioning is what cuts it).
#pragma once

#include "actors/train/shard/model_shard.hpp"
#include "actors/train/stage/model_stage.hpp"
#include "actors/train/config/precision.hpp"
#include "actors/train/config/run_config.hpp"
#include "models/bert/parameter_specs.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dsa::train {

struct model_state_bytes {
  std::int64_t weights = 0, grads = 0, reduced = 0, masters = 0, half_masters = 0, moments = 0, version = 0;
  std::int64_t swap_buffers = 0; // NVMe offload: masters and moments are on NVMe, these in memory
  std::int64_t total() const {
    return weights + grads + reduced + masters + half_masters + moments + version + swap_buffers;
  }
  bool operator==(const model_state_bytes& o) const;
  // "weights 1.2 MiB + gradients ... = total"
  std::string describe() const;
};

// ZeRO: the stage's padded flat size and one rank's partition of it; with stage 2
// (gradients partitioned), the elements of a gradient kept whole beside the partition.
struct zero_sizes {
  std::int64_t padded = 0, partition = 0;
  int stage = 1;
  std::int64_t whole_gradient = 0;
  // ZeRO stage 3: the elements of the tensors kept whole on every rank
  // (stage3_param_persistence_threshold); the stage holds those and its partition.
  std::int64_t persistent = 0;
  // ZeRO-3 with offload_param on NVMe: the partition's elements kept in memory
  // (offload_param.max_in_cpu; -1: all of them) and the bytes of the transfer buffers.
  std::int64_t param_in_memory = -1, param_buffers = 0;
  // ZeRO-2 on one pipeline stage: the stage's gradients are summed into its partition per
  // micro-batch, 4 bytes per partition element instead of per parameter (as stage 3 always).
  bool grads_partitioned = false;
  // That partition (stage 3 or the above) in a file on NVMe (limits.gradient_partition):
  // only the windows a pass touches are resident (partition_grads::bytes).
  bool grads_in_file = false;
  // NVMe optimizer offload: the bytes of swap buffers the partition's masters and
  // moments pass through instead of living in memory (0: in memory).
  std::int64_t swap_buffers = 0;
  // 1-bit Adam / LAMB over the partition: the elements of moment-like state kept beside the
  // partition's moments (the whole momentum; 1-bit LAMB's fresh variance of the partition).
  std::int64_t onebit_extra = 0;
};

// DeepSpeed's model-state accounting for mixed-precision training of `parameters` on
// `ranks` ranks at ZeRO stage `stage`: 16Ψ, 4Ψ + 12Ψ/n, 2Ψ + 14Ψ/n, 16Ψ/n bytes.
double deepspeed_model_states(std::int64_t parameters, int stage, int ranks);

// From the parameter count alone (and the flat layout's sizes with ZeRO).
model_state_bytes expected_model_states(std::int64_t parameters, precision working,
                                        std::optional<zero_sizes> zero = std::nullopt);
// ZeRO sizes of a stage's parameters over `ranks` ranks (the shard's flat layout).
zero_sizes zero_sizes_of(const std::vector<bert::param_spec>& specs, std::uint32_t ranks);
// Whether the first and last stage's reducers exchange the tied word embedding's
// gradient: several stages, and the last holds the decoder tied to it.
bool tied_exchanged(const run_config& rc, const std::vector<bert::bert_range>& ranges);
// The ZeRO sizes a run's shard of stage s (of the stages holding `ranges`) uses; none
// without ZeRO (stage 0, or one rank without NVMe offload).
std::optional<zero_sizes> run_zero_sizes(const run_config& rc, const std::vector<bert::bert_range>& ranges,
                                         std::size_t s);
// From the tensors a stage and its shard hold (after the shard's first update, which
// allocates the next version's tensors).
model_state_bytes measured_model_states(const model_stage& stage, const model_shard& shard);

// The device bytes a CUDA rank's model states take for a stage of these parameters: the
// stage's part holds each f32 gradient and the value the kernels read (a 2-byte working copy
// of each matrix and table under half storage, f32 otherwise: no f32 masters, the shard keeps
// them), and with the GPU-resident optimizer (offload_optimizer "none") its f32 master, two
// f32 moments and (half storage) working copy of every parameter, and its gradient scratch
// (the largest parameter in f32). Activations, the stash and workspace come on top.
// ZeRO-3 with partitions (cuda_zero3.hpp): the persistent tensors' values
// (stage3_param_persistence_threshold); the values of cuda_zero3_window parts (the embeddings,
// a layer, the head with the tied word embedding it reads), the largest ones: the part
// computing and those bound ahead of it; the f32 gradients of the two largest parts (the
// one computing, the one before it copying down to the host); and (pre-training head) the
// word embedding's gradient, bound from the head's backward to the embeddings'.
std::int64_t cuda_model_state_bytes(const run_config& rc, const std::vector<bert::param_spec>& specs);
// ZeRO-3 on a CUDA rank, its pinned host buffers (cuda_zero3.hpp): the one a part's final
// gradients come down through (the largest part's f32 gradients) and the window's upload
// buffers (each the persistent tensors and the largest part's gathered ones, in the working
// precision, each tensor padded to 64 bytes).
std::int64_t cuda_zero3_staging_bytes(const run_config& rc, const std::vector<bert::param_spec>& specs);
// ZeRO-3 on a CUDA rank: how many parts' weights may be bound on the device at once at most
// (the part computing and those copied ahead of it): 1 + how many of the largest encoder
// layer's gathered elements stage3_prefetch_bucket_size holds (the largest part's in a range
// without layers), at most the range's parts.
std::int64_t cuda_zero3_window_limit(const run_config& rc, const std::vector<bert::param_spec>& specs);
// The window the run uses: rc.zero3_device_window (the device plan's choice) within the
// limit, or the limit when none was chosen.
std::int64_t cuda_zero3_window(const run_config& rc, const std::vector<bert::param_spec>& specs);

} // namespace dsa::train
