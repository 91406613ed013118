// make_shard picks the shard's mode from its options, and every mode answers the run's
// questions (traffic, bytes, gradient summing, the last swap writes) before its init as
// after it: a run that fails before the shards start still reports without a crash. And
// the GPU-resident mode (device_shard) equals the host mode bit for bit.
#include "actors/train/shard/device_shard.hpp"
#include "actors/train/shard/shard_options.hpp"
#include "core/philox.hpp"
#include "models/bert/bert_config.hpp"
#include "models/bert/bert_range.hpp"
#include "models/bert/parameter_specs.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
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

// The GPU-resident optimizer's mode (device_shard over an optimizer_device) against the
// host mode (whole_shard) on every machine: over the host device (the same element rule
// on the CPU) the two publish the same versions and checkpoint the same state, bit for
// bit, through clipping, an fp16 overflow skip, a speculated step kept and one rolled
// back, and a resume from the other mode's checkpoint. The CUDA device runs the same
// flow; its kernel is checked against the CPU's in the gpu suite (test_gpu_stage.cpp).
namespace {

train::shard_options device_options(optim::optimizer_type type, train::precision working, bool fp16_scaling) {
  train::shard_options o;
  const bert::bert_config cfg = tiny_model();
  o.specs = bert::parameter_specs(cfg, bert::bert_range::whole(cfg));
  o.optimizer.type = type;
  o.optimizer.lr = 1e-2;
  o.optimizer.weight_decay = 0.01;
  o.working = working;
  train::step_decider_options d;
  d.base_lr = 1e-2;
  d.clip = 0.5; // the random gradients' norms are above it: clipping fires
  d.scaling = fp16_scaling;
  d.scaler.initial_scale_power = 4;
  o.decider = std::make_unique<train::step_decider>(d, nullptr);
  return o;
}

// Values ~ U(-1, 1) from a seed and the tensor's index.
std::vector<tensor> random_like(const std::vector<bert::param_spec>& specs, std::uint64_t seed) {
  std::vector<tensor> out;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    tensor t = tensor::empty(specs[i].shape, dtype::f32);
    philox_stream rng{seed, static_cast<std::uint32_t>(i), 0, 0, 0};
    for (std::int64_t k = 0; k < t.numel(); ++k)
      t.data<float>()[k] = static_cast<float>(2.0 * rng.uniform(static_cast<std::uint64_t>(k)) - 1.0);
    out.push_back(t);
  }
  return out;
}

bool same_bits(const tensor& a, const tensor& b) {
  return a.type() == b.type() && a.numel() == b.numel() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// The step's gradients into a shard's buffers, and their totals as the reducer would give
// them (sum of squares; inf when `overflow`).
actors::grad_totals fill(train::model_shard& shard, const std::vector<tensor>& grads, bool overflow) {
  double sum = 0.0;
  auto buffers = shard.gradient_buffers();
  REQUIRE(buffers.size() == grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    buffers[i].copy_from(grads[i]);
    for (std::int64_t k = 0; k < grads[i].numel(); ++k) sum += double(grads[i].data<float>()[k]) * grads[i].data<float>()[k];
  }
  actors::grad_totals t;
  t.sum_of_squares = overflow ? std::numeric_limits<double>::infinity() : sum;
  t.own_sum_of_squares = t.sum_of_squares;
  return t;
}

} // namespace

TEST_CASE("device_shard over the host device equals whole_shard bit for bit: versions, skips, speculation, "
          "checkpoints, resume") {
  struct run_case {
    const char* name;
    optim::optimizer_type type;
    train::precision working;
    bool fp16;
  };
  for (const run_case& c : {run_case{"AdamW f32", optim::optimizer_type::adamw, train::precision::f32, false},
                            run_case{"Adam bf16", optim::optimizer_type::adam, train::precision::bf16, false},
                            run_case{"AdamW fp16, an overflow", optim::optimizer_type::adamw, train::precision::f16,
                                     true}}) {
    CAPTURE(c.name);
    train::shard_options host_o = device_options(c.type, c.working, c.fp16);
    train::shard_options dev_o = device_options(c.type, c.working, c.fp16);
    dev_o.device = train::make_host_optimizer_device(working_dtype(c.working));
    const auto specs = host_o.specs;
    auto host = train::make_shard(std::move(host_o));
    auto dev = train::make_shard(std::move(dev_o));
    REQUIRE(dynamic_cast<train::device_shard*>(dev.get()) != nullptr);
    const auto initial = random_like(specs, 1);
    host->init(initial);
    dev->init(initial);
    std::vector<tensor> hv, dv;
    for (std::uint32_t step = 0; step < 5; ++step) {
      CAPTURE(step);
      auto grads = random_like(specs, 100 + step);
      if (step == 3) // small enough that clipping does not fire: the speculated step is kept
        for (tensor& g : grads)
          for (std::int64_t k = 0; k < g.numel(); ++k) g.data<float>()[k] *= 1e-4f;
      const bool overflow = c.fp16 && step == 2;
      // Speculate on steps 1 (clipping fires: rolled back) and 3 (kept).
      if (step == 1 || step == 3) {
        fill(*host, grads, overflow);
        fill(*dev, grads, overflow);
        CHECK(host->speculate(step) == dev->speculate(step));
      }
      const auto ht = fill(*host, grads, overflow), dt = fill(*dev, grads, overflow);
      const bool hu = host->update(step, ht, hv), du = dev->update(step, dt, dv);
      CHECK(hu == du);
      CHECK(hu == !overflow);
      REQUIRE(hv.size() == dv.size());
      for (std::size_t i = 0; i < hv.size(); ++i) {
        CAPTURE(specs.size() > i ? specs[i].name : std::string("loss scale"));
        CHECK(same_bits(hv[i], dv[i]));
      }
    }
    CHECK(host->speculated() == dev->speculated());
    CHECK(host->rolled_back() == dev->rolled_back());
    CHECK(dev->rolled_back() >= 1);
    CHECK(dev->rolled_back() < dev->speculated()); // one speculated step was kept
    // The checkpoints: the same names and bits.
    const auto hp = host->payload(), dp = dev->payload();
    REQUIRE(hp.size() == dp.size());
    for (const auto& [name, t] : hp) {
      CAPTURE(name);
      REQUIRE(dp.count(name) == 1);
      CHECK(same_bits(t, dp.at(name)));
    }
    // Both modes resumed from the host shard's checkpoint (fresh deciders alike) hold its
    // state and take the next step alike.
    optim::optimizer_state st;
    std::map<std::string, tensor> masters;
    for (const auto& [name, t] : hp) {
      if (name.rfind("master.", 0) == 0) masters[name.substr(7)] = t.clone();
      else if (name == "optimizer_step_count") st.step = t.data<std::int64_t>()[0];
      else st.tensors[name] = t.clone();
    }
    std::vector<std::unique_ptr<train::model_shard>> resumed;
    for (bool on_device : {false, true}) {
      train::shard_options o = device_options(c.type, c.working, c.fp16);
      if (on_device) o.device = train::make_host_optimizer_device(working_dtype(c.working));
      o.resume_masters = masters;
      o.resume_state = st;
      resumed.push_back(train::make_shard(std::move(o)));
      resumed.back()->init(initial);
    }
    const auto rp = resumed[1]->payload();
    for (const auto& [name, t] : hp) {
      CAPTURE(name);
      CHECK(same_bits(t, rp.at(name)));
    }
    const auto grads = random_like(specs, 999);
    std::vector<tensor> a, b;
    resumed[0]->update(5, fill(*resumed[0], grads, false), a);
    resumed[1]->update(5, fill(*resumed[1], grads, false), b);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(same_bits(a[i], b[i]));
  }
}

TEST_CASE("device_shard refuses LAMB by name") {
  train::shard_options o = device_options(optim::optimizer_type::lamb, train::precision::f32, false);
  o.device = train::make_host_optimizer_device(dtype::f32);
  const auto specs = o.specs;
  auto shard = train::make_shard(std::move(o));
  CHECK_THROWS_WITH(shard->init(random_like(specs, 1)), doctest::Contains("runs Adam and AdamW, not Lamb"));
}
