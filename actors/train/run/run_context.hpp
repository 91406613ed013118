// The state one data-parallel rank of `dsactor run` shares between its setup, its
// optimizer shards and the step reporter (step_reporter.hpp).
#pragma once

#include "actors/train/stage/model_stage.hpp"
#include "actors/train/data/feed_source.hpp"
#include "actors/train/config/run_config.hpp"
#include "core/config.hpp"
#include "models/bert/bert_range.hpp"
#include "models/tokenizer/bert_tokenizer.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace dsa::train {

struct run_context {
  run_config rc;
  config cfg;
  std::shared_ptr<const tok::bert_tokenizer> tokenizer; // shared by the ranks of the process
  std::unique_ptr<batch_provider> provider;
  std::vector<bert::bert_range> ranges;
  stage_shared shared;
  std::vector<std::unique_ptr<model_stage>> stages; // made by make_stage
  std::uint32_t first_step = 0;
  std::uint32_t last_step = 0; // inclusive
  // The data's sequence length: position-embedding rows from here on get no gradient
  // (the compressed optimizers mask their momentum); -1 before the data is opened.
  std::int64_t seq_length = -1;
  int rank = 0;                // data-parallel rank (only rank 0 reports, saves and evaluates)
  // Facts for the trace's info frame (run_options::trace_facts): under a launcher, where the
  // rendezvous server's clock stands against this process's (trace_clock.hpp).
  std::vector<std::pair<std::string, std::string>> trace_facts;
};

} // namespace dsa::train
