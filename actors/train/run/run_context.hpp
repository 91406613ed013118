// One data-parallel rank of `dsactor run` in two parts, so that each function takes the
// part it needs: what the rank reads (run_inputs: settled while the run opens, the first
// step when it resumes) and what it builds from that (rank_model: its data, layer ranges
// and stages). run_context is both, for the phases that hold a rank whole.
#pragma once

#include "actors/plan.hpp"
#include "actors/train/stage/device_choice.hpp"
#include "actors/train/stage/model_stage.hpp"
#include "actors/train/data/feed_source.hpp"
#include "actors/train/config/run_config.hpp"
#include "core/config.hpp"
#include "models/bert/bert_range.hpp"
#include "models/tokenizer/bert_tokenizer.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dsa::train {

struct run_inputs {
  run_config rc;
  config cfg;
  std::shared_ptr<const tok::bert_tokenizer> tokenizer; // shared by the ranks of the process
  int rank = 0;                // data-parallel rank (only rank 0 reports, saves and evaluates)
  // Under dsactor launch: this process's rank in the job, and with stages across processes
  // (run_config::stages_across_processes) which process runs each stage of its replica;
  // this process builds only its own stages (stages[s] is null for the others).
  int process = 0;
  actors::stage_placement placement;
  bool local(std::uint32_t s) const { return placement.local(s); }
  device_choice device;        // where the stages compute (devices.backend; the ranks of a process share it)
  std::uint32_t first_step = 0;
  std::uint32_t last_step = 0; // inclusive
  // Facts for the trace's info frame (run_options::trace_facts): under a launcher, where the
  // rendezvous server's clock stands against this process's (trace_clock.hpp).
  std::vector<std::pair<std::string, std::string>> trace_facts;
};

struct rank_model {
  std::unique_ptr<batch_provider> provider;
  // The data's sequence length: position-embedding rows from here on get no gradient
  // (the compressed optimizers mask their momentum); -1 before the data is opened.
  std::int64_t seq_length = -1;
  std::vector<bert::bert_range> ranges;
  stage_shared shared;                              // the stages' counters (wall_clock_breakdown)
  std::vector<std::unique_ptr<model_stage>> stages; // made by make_stage; [s] null where another process runs s
};

struct run_context : run_inputs, rank_model {};

} // namespace dsa::train
