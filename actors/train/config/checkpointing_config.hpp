// DeepSpeed's activation_checkpointing section, read for model.checkpoint_activations (the
// switch, bert_config's): what dsactor cannot do as DeepSpeed documents it is refused by key.
#pragma once

#include "core/config.hpp"
#include "core/config_problems.hpp"

namespace dsa::train {

// Returns activation_checkpointing.cpu_checkpointing (a CUDA rank refuses it: choose_device).
bool read_activation_checkpointing(const config& cfg, config_problems& problems);

} // namespace dsa::train
