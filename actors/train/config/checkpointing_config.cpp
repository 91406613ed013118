// See checkpointing_config.hpp.
#include "actors/train/config/checkpointing_config.hpp"

#include "optim/param_reader.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <optional>

namespace dsa::train {

bool read_activation_checkpointing(const config& cfg, config_problems& problems) {
  optim::param_reader r(cfg, "activation_checkpointing", problems);
  bool partition = false, contiguous = false, cpu_checkpointing = false, synchronize = false, profile = false;
  std::optional<std::int64_t> number;
  r.read("partition_activations", partition);
  r.read("contiguous_memory_optimization", contiguous);
  r.read("cpu_checkpointing", cpu_checkpointing); // CPU ranks: the checkpoints are in host memory already
  r.read("number_checkpoints", number);             // sizes the contiguous buffers: none here
  r.read("synchronize_checkpoint_boundary", synchronize); // a device synchronize: none on CPU ranks
  r.read("profile", profile);
  r.check_unknown();
  if (partition)
    r.invalid("partition_activations", "partitions each checkpoint over the model-parallel ranks, and dsactor has "
                                       "no tensor model parallelism (a rank holds whole layers): set false");
  if (contiguous)
    r.invalid("contiguous_memory_optimization",
              "moves the partitioned checkpoints into one buffer and needs partition_activations (as in DeepSpeed), "
              "which dsactor does not run: set false");
  if (profile)
    r.invalid("profile", "the checkpointed layers are not timed apart; the actor trace has each stage's forward and "
                         "backward (dsactor trace RUN summary): set false");
  if (number && *number < 1)
    r.invalid("number_checkpoints", fmt::format("must be at least 1, got {}", *number));
  return cpu_checkpointing;
}

} // namespace dsa::train
