// The end-of-run evaluation of a run's model (rank 0), from its stages' weights, on the
// rank's device: the CPU, or with devices.backend = "cuda" the GPU the stages ran on.
#pragma once

#include "actors/train/config/run_config.hpp"
#include "actors/train/stage/device_choice.hpp"
#include "actors/train/stage/model_stage.hpp"
#include "models/tokenizer/bert_tokenizer.hpp"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dsa::train {

// Held-out shards (pre-training) or the SQuAD dev set (`tokenizer` needed then), as
// rc.data names them; returns the exit code (1 when it fails).
// stages[s] may be null where another process ran stage s (stages across processes):
// `elsewhere` then holds those stages' weights by name, sent by their processes.
int evaluate(const run_config& rc, const device_choice& device, const tok::bert_tokenizer* tokenizer,
             const std::vector<std::unique_ptr<model_stage>>& stages,
             const std::map<std::string, tensor>& elsewhere = {});

// Whether rc names anything to evaluate (held-out shards, or a SQuAD dev set).
bool evaluates_anything(const run_config& rc);

// A stage's weights as the evaluation assembles them (the owner's copy of a tied weight).
std::map<std::string, tensor> evaluation_weights(model_stage& stage);

} // namespace dsa::train
