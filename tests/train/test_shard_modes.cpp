// make_shard picks the shard's mode from its options, and every mode answers the run's
// questions (traffic, bytes, gradient summing, the last swap writes) before its init as
// after it: a run that fails before the shards start still reports without a crash.
#include "actors/train/shard/shard_options.hpp"
#include "models/bert/bert_config.hpp"
#include "models/bert/bert_range.hpp"
#include "models/bert/parameter_specs.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

using namespace dsa;

namespace {

bert::bert_config tiny_model() {
  bert::bert_config cfg;
  cfg.num_layers = 1;
  cfg.hidden_size = 8;
  cfg.num_heads = 2;
  cfg.intermediate_size = 16;
  cfg.vocab_size = 32;
  cfg.max_position_embeddings = 16;
  return cfg;
}

train::shard_options options(optim::optimizer_type type, std::uint32_t zero_ranks) {
  train::shard_options o;
  const bert::bert_config cfg = tiny_model();
  o.specs = bert::parameter_specs(cfg, bert::bert_range::whole(cfg));
  o.optimizer.type = type;
  o.decider = std::make_unique<train::step_decider>(train::step_decider_options{}, nullptr);
  o.zero_ranks = zero_ranks;
  return o;
}

std::vector<tensor> zero_weights(const std::vector<bert::param_spec>& specs) {
  std::vector<tensor> out;
  for (const auto& s : specs) out.push_back(tensor::zeros(s.shape, dtype::f32));
  return out;
}

} // namespace

TEST_CASE("make_shard: whole, compressed and partitioned modes answer the run's questions before init") {
  struct mode {
    const char* name;
    optim::optimizer_type type;
    std::uint32_t zero_ranks;
    bool per_rank;
  };
  for (const mode& m : {mode{"whole AdamW", optim::optimizer_type::adamw, 1, false},
                        mode{"whole OneBitAdam", optim::optimizer_type::onebit_adam, 1, false},
                        mode{"ZeRO partition of 2", optim::optimizer_type::adamw, 2, true}}) {
    CAPTURE(m.name);
    auto shard = train::make_shard(options(m.type, m.zero_ranks));
    REQUIRE(shard != nullptr);
    CHECK(shard->per_rank_checkpoint() == m.per_rank);
    CHECK(shard->traffic() == nullptr);
    CHECK(shard->sums_gradients());
    CHECK(shard->flush_state().has_value());
    CHECK(shard->swap_report().empty());
    CHECK(shard->speculated() == 0);
    const train::shard_bytes b = shard->held_bytes();
    CHECK(b.gradients + b.masters + b.moments + b.version + b.swap_buffers == 0);
  }
}

TEST_CASE("make_shard: a whole shard after init holds its masters, gradients and moments, and checkpoints whole") {
  for (const auto type : {optim::optimizer_type::adamw, optim::optimizer_type::onebit_adam}) {
    CAPTURE(optim::optimizer_name(type));
    train::shard_options o = options(type, 1);
    const auto specs = o.specs;
    auto shard = train::make_shard(std::move(o));
    shard->init(zero_weights(specs));
    std::int64_t elements = 0;
    for (const auto& s : specs) elements += tensor::zeros(s.shape, dtype::f32).numel();
    const train::shard_bytes b = shard->held_bytes();
    CHECK(b.masters == 4 * elements);
    CHECK(b.gradients == 4 * elements);
    CHECK(shard->gradient_buffers().size() == specs.size());
    const train::state_payload p = shard->payload();
    for (const auto& s : specs) CHECK(p.count("master." + s.name) == 1);
    CHECK(p.count("optimizer_step_count") == 1);
    CHECK((type == optim::optimizer_type::onebit_adam) == (shard->traffic() != nullptr));
  }
}
