// The CUDA stage (actors/train/stage/cuda_stage.hpp) against the CPU stage (bert_stage)
// through the runtime's stage_compute interface, as `dsactor run` drives them: a three-layer
// BERT cut into three stages, two micro-batches in flight (two stash slots) forward through
// host slots and backward,
// every gradient as the reducer takes it (rounded to the working precision), in f32 and
// bf16 with dropout on; then a parameter version loaded into both and a second forward,
// whose loss must follow; and the refusals of ZeRO's partitions.
#include "gpu_test_util.hpp"

#include "actors/train/data/batch_packing.hpp"
#include "actors/train/stage/bert_stage.hpp"
#include "actors/train/shard/optimizer_device.hpp"
#include "actors/train/stage/cuda_stage.hpp"
#include "core/philox.hpp"
#include "optim/optimizer.hpp"
#include "gpu_bert_fixture.hpp"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>

namespace dsa::test {
namespace {

std::vector<bert::bert_range> three_ranges() {
  return {bert::bert_range::layers(0, 1).with_embeddings(), bert::bert_range::layers(1, 2),
          bert::bert_range::layers(2, 3).with_head()};
}

train::stage_options options_for(const bert::bert_config& cfg, const bert::bert_range& range, train::precision p) {
  train::stage_options o;
  o.model = cfg;
  o.range = range;
  o.micro_batches = 2;
  o.working = p;
  o.seed = 5;
  o.device_index = 0;
  return o;
}

// Two micro-batches through `stages` as 1F1B's warm-up holds them (both forwards, then both
// backwards, each in its own stash slot; host slots handed on as the runtime does); the
// gradients accumulate over both. The mean loss.
double run_two_micro_batches(std::vector<std::unique_ptr<train::model_stage>>& stages, const tensor& input,
                             const tensor& labels, std::uint32_t step) {
  double loss = 0.0;
  std::vector<std::vector<tensor>> grads_out(2);
  std::vector<std::vector<tensor>> slots(2, std::vector<tensor>{input});
  for (std::uint32_t mb = 0; mb < 2; ++mb)
    for (std::size_t i = 0; i < stages.size(); ++i) {
      std::vector<tensor> out;
      const double l = stages[i]->forward({step, mb, mb}, slots[mb], i + 1 == stages.size() ? labels : tensor{}, out);
      if (i + 1 == stages.size()) loss += l / 2;
      slots[mb] = out;
    }
  for (std::uint32_t mb = 0; mb < 2; ++mb) {
    tensor grad;
    for (std::size_t i = stages.size(); i-- > 0;) {
      tensor grad_in;
      stages[i]->backward({step, mb, mb}, grad, grad_in);
      grad = grad_in;
    }
  }
  return loss;
}

} // namespace

TEST_CASE("cuda stage equals the CPU stage through stage_compute: losses, every gradient, a loaded version") {
  const bert::bert_config cfg = gpu_bert_config(3);
  const bert::bert_batch batch = small_batch(cfg);
  const tensor input = train::pack_inputs(batch);
  const tensor labels = train::pack_labels(batch, cfg.head);
  for (const train::precision p : {train::precision::f32, train::precision::bf16, train::precision::f16}) {
    INFO("working precision " << train::precision_name(p));
    train::stage_shared shared;
    std::vector<std::unique_ptr<train::model_stage>> cpu, gpu;
    for (const auto& r : three_ranges()) {
      cpu.push_back(train::make_stage(train::stage_device::cpu, options_for(cfg, r, p), shared));
      gpu.push_back(train::make_stage(train::stage_device::cuda, options_for(cfg, r, p), shared));
      for (auto* s : {cpu.back().get(), gpu.back().get()}) {
        prepare_gpu_bert(s->named_parameters()); // values away from the near-linear real init
        s->reserve_stash(2);
        s->loss_scale() = p == train::precision::f16 ? 1024.0 : 1.0; // fp16 trains loss-scaled
      }
    }
    const double want = run_two_micro_batches(cpu, input, labels, 1);
    const double got = run_two_micro_batches(gpu, input, labels, 1);
    const test::tolerance& limit = p == train::precision::f32 ? test::gpu_f32_vs_cpu : test::gpu_half_vs_cpu;
    CHECK(std::fabs(got - want) <= limit.rel * std::fabs(want));
    for (std::size_t s = 0; s < 3; ++s) {
      const auto g = gpu[s]->gradients(), c = cpu[s]->gradients();
      REQUIRE(g.size() == c.size());
      const auto& entries = gpu[s]->named_parameters().entries();
      for (std::size_t i = 0; i < g.size(); ++i) {
        tensor gw = train::cast_to(g[i], dtype::f32), cw = train::cast_to(c[i], dtype::f32);
        const double err = distance(gw.data<float>(), cw.data<float>(), gw.numel()) /
                           std::max(distance(cw.data<float>(), nullptr, cw.numel()), 1e-30);
        INFO("stage " << s << ", " << entries[i].spec.name << ": relative error " << err);
        if (entries[i].spec.name.find("key.bias") == std::string::npos) // ~0 up to rounding
          CHECK(err <= limit.rel);
      }
    }
    // A version (every weight x 0.5, loss scale 1) into both; the next forward follows it.
    for (std::size_t s = 0; s < 3; ++s) {
      std::vector<tensor> version;
      for (const tensor& w : cpu[s]->parameters()) {
        tensor h = train::cast_to(w, dtype::f32);
        for (std::int64_t k = 0; k < h.numel(); ++k) h.data<float>()[k] *= 0.5f;
        version.push_back(train::cast_to(h, w.type()));
      }
      version.push_back(train::loss_scale_tensor(1.0));
      cpu[s]->load_parameters(version);
      gpu[s]->load_parameters(version);
      const auto gp = gpu[s]->parameters(), cp = cpu[s]->parameters();
      for (std::size_t i = 0; i < gp.size(); ++i)
        CHECK(std::memcmp(gp[i].raw_data(), cp[i].raw_data(), gp[i].nbytes()) == 0);
    }
    const double want2 = run_two_micro_batches(cpu, input, labels, 2);
    const double got2 = run_two_micro_batches(gpu, input, labels, 2);
    CHECK(want2 != want);
    CHECK(std::fabs(got2 - want2) <= limit.rel * std::fabs(want2));
  }
}

TEST_CASE("cuda stage refuses a missing gradient partition or fetcher by name") {
  const bert::bert_config cfg = gpu_bert_config(3);
  train::stage_shared shared;
  train::stage_options o = options_for(cfg, bert::bert_range::layers(1, 2), train::precision::bf16);
  auto stage = train::make_stage(train::stage_device::cuda, o, shared);
  CHECK_THROWS_WITH(stage->enable_partitioned_grads(nullptr), doctest::Contains("no gradient partition"));
  CHECK_THROWS_WITH(stage->enable_zero3(nullptr, nullptr), doctest::Contains("ZeRO-3 without a fetcher"));
  o.whole_gradients = false; // ZeRO-2 on one stage: made (the partition comes with enable_partitioned_grads)
  CHECK(train::make_stage(train::stage_device::cuda, o, shared) != nullptr);
}

} // namespace dsa::test

namespace dsa::test {

// The GPU-resident optimizer's device against the host one: the same Adam element rule
// (kernels/common/adam_math.hpp) through cuda::adam_update and cpu::adam_update, so the
// masters, moments and bf16 working copies agree bit for bit over three steps, and a
// state written back reads back unchanged.
TEST_CASE("cuda optimizer device equals the host device bit for bit") {
  for (const dtype working : {dtype::f32, dtype::bf16}) {
    auto gpu = train::make_cuda_optimizer_device(0, working);
    auto host = train::make_host_optimizer_device(working);
    const std::vector<std::int64_t> sizes{1, 37, 4096 + 5};
    philox_stream rng{3, 0, 0, 0, 0};
    std::uint64_t k = 0;
    auto random = [&](std::int64_t n) {
      tensor t = tensor::empty({n}, dtype::f32);
      for (std::int64_t i = 0; i < n; ++i) t.data<float>()[i] = static_cast<float>(rng.uniform(k++) - 0.5);
      return t;
    };
    for (std::int64_t n : sizes) {
      const tensor master = random(n);
      gpu->add(master, tensor{}, tensor{});
      host->add(master, tensor{}, tensor{});
    }
    optim::optimizer_config cfg;
    cfg.type = optim::optimizer_type::adamw;
    for (std::int64_t step = 1; step <= 3; ++step)
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const tensor g = random(sizes[i]);
        const auto p = optim::adam_step_params(cfg, 1e-2, i == 0 ? 0.0 : 0.01, step);
        gpu->step(i, g, p);
        host->step(i, g, p);
      }
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      tensor gv, hv, gm, gm1, gm2, hm, hm1, hm2;
      gpu->read_version(i, gv);
      host->read_version(i, hv);
      gpu->wait_reads();
      CHECK(gv.type() == hv.type());
      CHECK(std::memcmp(gv.raw_data(), hv.raw_data(), hv.nbytes()) == 0);
      gpu->read_state(i, gm, gm1, gm2);
      host->read_state(i, hm, hm1, hm2);
      gpu->wait_reads();
      CHECK(std::memcmp(gm.raw_data(), hm.raw_data(), hm.nbytes()) == 0);
      CHECK(std::memcmp(gm1.raw_data(), hm1.raw_data(), hm1.nbytes()) == 0);
      CHECK(std::memcmp(gm2.raw_data(), hm2.raw_data(), hm2.nbytes()) == 0);
      gpu->write_state(i, hm, hm1, hm2);
      tensor back, b1, b2;
      gpu->read_state(i, back, b1, b2);
      gpu->wait_reads();
      CHECK(std::memcmp(back.raw_data(), hm.raw_data(), hm.nbytes()) == 0);
    }
    CHECK(gpu->where() == "cuda:0");
    CHECK(gpu->bytes() >= host->bytes());
  }
}

} // namespace dsa::test
