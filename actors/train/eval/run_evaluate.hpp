// The end-of-run evaluation of a run's model (rank 0), from its stages' weights, on the
// rank's device: the CPU, or with devices.backend = "cuda" the GPU the stages ran on.
#pragma once

#include "actors/train/config/run_config.hpp"
#include "actors/train/stage/device_choice.hpp"
#include "actors/train/stage/model_stage.hpp"
#include "models/tokenizer/bert_tokenizer.hpp"

#include <memory>
#include <vector>

namespace dsa::train {

// Held-out shards (pre-training) or the SQuAD dev set (`tokenizer` needed then), as
// rc.data names them; returns the exit code (1 when it fails).
int evaluate(const run_config& rc, const device_choice& device, const tok::bert_tokenizer* tokenizer,
             const std::vector<std::unique_ptr<model_stage>>& stages);

} // namespace dsa::train
