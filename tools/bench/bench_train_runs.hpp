// What `dsactor bench train` and `bench offload --backend cuda` share (bench_train.cpp):
// one BERT run's setup, its model, and a `dsactor run` of it timed from its metrics.
#pragma once

#include "core/error.hpp"
#include "models/bert/bert_config.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::tools {

struct train_setup {
  std::string model = "bert-large";
  std::int64_t big_layers = 30; // --model bert-6b's layer count (--layers)
  std::string task = "pretraining";
  std::int64_t seq = 128, batch = 64, steps = 8;
  std::int64_t accumulation = 1; // micro-batches of `batch` per step (bench offload --backend cuda: 4)
  int warmup = 2;
  std::string work;
};

// BERT-large or -base, or bert-6b (a BERT-shaped model: 30 layers of hidden 4096 by default).
bert::bert_config train_model_config(const train_setup& b);
// One `dsactor run` (CUDA, bf16) of `b` on the data in `data` with `overrides`: its median step
// time after the warm-up, and the shards' median update time into `update_seconds` when given.
expected<double> train_run_seconds(const train_setup& b, const std::string& data, const std::string& name,
                                   const std::vector<std::string>& overrides, double* update_seconds = nullptr);

} // namespace dsa::tools
