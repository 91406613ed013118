// Tests for optim/optimizer: the BERT no-decay rule, Adam/AdamW/L2 and LAMB through groups
// against hand values, config parsing errors, and a bit-exact state round trip.
#include "optim/lr_schedule.hpp"
#include "optim/optimizer.hpp"

#include "core/half.hpp"
#include "core/memory_stats.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace {

using namespace dsa::optim;
using dsa::tensor;

tensor filled(std::vector<float> values) {
  tensor t = tensor::empty({static_cast<std::int64_t>(values.size())}, dsa::dtype::f32);
  std::memcpy(t.data<float>(), values.data(), values.size() * sizeof(float));
  return t;
}

param_slot slot(std::string name, std::vector<float> p, std::vector<float> g) {
  param_slot s;
  s.name = std::move(name);
  s.param = filled(std::move(p));
  s.grad = filled(std::move(g));
  return s;
}

optimizer must(dsa::expected<optimizer> o) {
  if (!o) FAIL(o.err().to_string());
  return std::move(*o);
}

dsa::config parse(const char* text) {
  auto c = dsa::config::parse(text, "test.toml");
  REQUIRE(c.has_value());
  return std::move(*c);
}

bool same_bits(const tensor& a, const tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

} // namespace

TEST_CASE("bert_no_decay: biases and LayerNorm get no weight decay") {
  CHECK(bert_no_decay("bert.encoder.layer.0.attention.self.query.bias"));
  CHECK(bert_no_decay("bert.embeddings.LayerNorm.weight"));
  CHECK(bert_no_decay("bert.encoder.layer.11.output.LayerNorm.bias"));
  CHECK(bert_no_decay("cls.predictions.bias"));
  CHECK_FALSE(bert_no_decay("bert.encoder.layer.0.attention.self.query.weight"));
  CHECK_FALSE(bert_no_decay("bert.embeddings.word_embeddings.weight"));
  CHECK_FALSE(bert_no_decay("bert.pooler.dense.weight"));
  CHECK_FALSE(bert_no_decay("bias.weight")); // "bias" must end the name

  std::vector<param_slot> params;
  for (const char* n : {"bert.embeddings.word_embeddings.weight", "bert.embeddings.LayerNorm.weight",
                        "bert.embeddings.LayerNorm.bias", "bert.pooler.dense.weight", "bert.pooler.dense.bias"})
    params.push_back(slot(n, {1.0f}, {0.0f}));
  auto groups = bert_param_groups(std::move(params), 0.01, 1e-4);
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].name == "decay");
  CHECK(groups[0].weight_decay == 0.01);
  REQUIRE(groups[0].params.size() == 2);
  CHECK(groups[0].params[0].name == "bert.embeddings.word_embeddings.weight");
  CHECK(groups[0].params[1].name == "bert.pooler.dense.weight");
  CHECK(groups[1].name == "no_decay");
  CHECK(groups[1].weight_decay == 0.0);
  CHECK(groups[1].params.size() == 3);
  CHECK(groups[1].lr == 1e-4);
}

TEST_CASE("optimizer AdamW over groups: hand values, decay only in the decay group") {
  // lr 0.1, wd 0.1, p = 2, g = 0.5, one step (bias correction on):
  //   decay group:    p = 2 - 0.1*0.1*2 - 0.1/(1-0.9) * 0.05 / (0.5 + 1e-8) = 1.880000002
  //   no-decay group: p = 2 - 1.0 * 0.05 / (0.5 + 1e-8) = 1.900000002
  optimizer_config cfg;
  cfg.type = optimizer_type::adamw;
  std::vector<param_slot> params;
  params.push_back(slot("encoder.dense.weight", {2.0f}, {0.5f}));
  params.push_back(slot("encoder.dense.bias", {2.0f}, {0.5f}));
  auto opt = must(optimizer::create(cfg, bert_param_groups(std::move(params), 0.1, 0.1)));
  opt.step();
  CHECK(opt.step_count() == 1);
  const auto& g = opt.groups();
  CHECK(g[0].params[0].param.data<float>()[0] == doctest::Approx(2.0 - 0.02 - 0.05 / (0.5 + 1e-8)).epsilon(1e-7));
  CHECK(g[1].params[0].param.data<float>()[0] == doctest::Approx(2.0 - 0.05 / (0.5 + 1e-8)).epsilon(1e-7));
  CHECK(g[0].params[0].m.data<float>()[0] == doctest::Approx(0.05).epsilon(1e-6));
  CHECK(g[0].params[0].v.data<float>()[0] == doctest::Approx(0.00025).epsilon(1e-6));
}

TEST_CASE("optimizer Adam: adam_w_mode selects decoupled decay or L2") {
  // L2: g' = 0.5 + 0.1*2 = 0.7; p = 2 - 1.0 * 0.07 / (0.7 + 1e-8) = 1.9000000014
  for (bool w_mode : {true, false}) {
    optimizer_config cfg;
    cfg.type = optimizer_type::adam;
    cfg.adam_w_mode = w_mode;
    std::vector<param_group> groups{{"all", {}, 0.1, 0.1}};
    groups[0].params.push_back(slot("w", {2.0f}, {0.5f}));
    auto opt = must(optimizer::create(cfg, std::move(groups)));
    opt.step();
    double want = w_mode ? 2.0 - 0.02 - 0.05 / (0.5 + 1e-8) : 2.0 - 0.07 / (0.7 + 1e-8);
    CHECK(opt.groups()[0].params[0].param.data<float>()[0] == doctest::Approx(want).epsilon(1e-7));
  }
}

TEST_CASE("optimizer Lamb: per-tensor trust ratios and the half copy") {
  // Tensor "a": p = (3, 4), g = (1, -1): coeff 5 (1 + 1e-8)/sqrt(2); p -= 0.01 * 5/sqrt(2) * (1, -1)
  optimizer_config cfg;
  cfg.type = optimizer_type::lamb;
  std::vector<param_group> groups{{"all", {}, 0.0, 0.01}};
  groups[0].params.push_back(slot("a", {3.0f, 4.0f}, {1.0f, -1.0f}));
  groups[0].params.push_back(slot("b", {0.0f, 0.0f, 0.0f}, {1.0f, 1.0f, 1.0f}));
  groups[0].params[0].half_copy = tensor::empty({2}, dsa::dtype::bf16);
  auto opt = must(optimizer::create(cfg, std::move(groups)));
  opt.step();
  REQUIRE(opt.last_lamb_coeffs().size() == 2);
  CHECK(opt.last_lamb_coeffs()[0] == doctest::Approx(5.0 / std::sqrt(2.0)).epsilon(1e-6));
  CHECK(opt.last_lamb_coeffs()[1] == 1.0f); // ||p|| = 0
  const auto& a = opt.groups()[0].params[0];
  CHECK(a.param.data<float>()[0] == doctest::Approx(3.0 - 0.05 / std::sqrt(2.0)).epsilon(1e-7));
  CHECK(a.half_copy.data<std::uint16_t>()[1] == dsa::f32_to_bf16(a.param.data<float>()[1]));
}

TEST_CASE("optimizer: one-cycle momentum overwrites beta2 with 0.99") {
  one_cycle_params p;
  p.cycle_min_lr = 0.01;
  p.cycle_max_lr = 0.1;
  p.cycle_first_step_size = 4;
  auto sched = make_one_cycle(p);
  REQUIRE(sched.has_value());
  optimizer_config cfg;
  std::vector<param_group> groups{{"all", {}, 0.0, 1e-3}};
  groups[0].params.push_back(slot("w", {1.0f}, {0.1f}));
  auto opt = must(optimizer::create(cfg, std::move(groups)));
  (*sched)->step();
  opt.set_lr((*sched)->lr());
  auto b = (*sched)->momentum();
  REQUIRE(b.has_value());
  opt.set_betas(b->beta1, b->beta2);
  CHECK(opt.settings().beta2 == 0.99);
  CHECK(opt.settings().beta1 == doctest::Approx(0.875));
  CHECK(opt.groups()[0].lr == doctest::Approx(0.0325));
}

TEST_CASE("optimizer: invalid slots are errors naming the parameter") {
  optimizer_config cfg;
  std::vector<param_group> groups{{"all", {}, 0.0, 1e-3}};
  groups[0].params.push_back(slot("w", {1.0f, 2.0f}, {0.1f}));
  auto bad = optimizer::create(cfg, std::move(groups));
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.err().message.find("'w'") != std::string::npos);
  std::vector<param_group> twice{{"all", {}, 0.0, 1e-3}};
  twice[0].params.push_back(slot("w", {1.0f}, {0.1f}));
  twice[0].params.push_back(slot("w", {1.0f}, {0.1f}));
  CHECK_FALSE(optimizer::create(cfg, std::move(twice)).has_value());
}

TEST_CASE("optimizer state: save, restore into a fresh optimizer, continue bit-exactly") {
  for (optimizer_type type : {optimizer_type::adamw, optimizer_type::lamb}) {
    CAPTURE(static_cast<int>(type));
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    auto random = [&](int n) {
      std::vector<float> x(n);
      for (auto& e : x) e = u(rng);
      return x;
    };
    optimizer_config cfg;
    cfg.type = type;
    cfg.weight_decay = 0.01;
    std::vector<param_slot> params;
    params.push_back(slot("encoder.dense.weight", random(37), random(37)));
    params.push_back(slot("encoder.dense.bias", random(5), random(5)));
    auto a = must(optimizer::create(cfg, bert_param_groups(std::move(params), 0.01, 1e-2)));
    a.step();
    a.step();
    optimizer_state saved = a.save_state();
    CHECK(saved.step == 2);
    CHECK(saved.tensors.size() == 4);
    CHECK(saved.tensors.count("encoder.dense.weight.exp_avg_sq") == 1);

    // A fresh optimizer over copies of the current params and grads.
    std::vector<param_slot> copies;
    for (const auto& g : a.groups())
      for (const auto& s : g.params) {
        param_slot c;
        c.name = s.name;
        c.param = s.param.clone();
        c.grad = s.grad.clone();
        copies.push_back(std::move(c));
      }
    auto b = must(optimizer::create(cfg, bert_param_groups(std::move(copies), 0.01, 1e-2)));
    auto loaded = b.load_state(saved);
    REQUIRE(loaded.has_value());
    CHECK(b.step_count() == 2);
    a.step();
    b.step();
    for (std::size_t gi = 0; gi < a.groups().size(); ++gi)
      for (std::size_t pi = 0; pi < a.groups()[gi].params.size(); ++pi) {
        const auto &x = a.groups()[gi].params[pi], &y = b.groups()[gi].params[pi];
        CHECK(same_bits(x.param, y.param));
        CHECK(same_bits(x.m, y.m));
        CHECK(same_bits(x.v, y.v));
      }
    saved.tensors.erase("encoder.dense.bias.exp_avg");
    auto missing = b.load_state(saved);
    REQUIRE_FALSE(missing.has_value());
    CHECK(missing.err().message.find("encoder.dense.bias.exp_avg") != std::string::npos);
  }
}

TEST_CASE("optimizer state views share the live moments and allocate nothing; save_state copies") {
  optimizer_config cfg;
  cfg.type = optimizer_type::adam;
  std::vector<param_slot> params;
  params.push_back(slot("encoder.dense.weight", std::vector<float>(4099, 0.5f), std::vector<float>(4099, 0.25f)));
  auto a = must(optimizer::create(cfg, bert_param_groups(std::move(params), 0.0, 1e-2)));
  a.step();
  const auto before = dsa::memory_usage_of(dsa::device::cpu());
  optimizer_state views = a.state_views();
  const auto during = dsa::memory_usage_of(dsa::device::cpu());
  CHECK(during.allocations == before.allocations);
  CHECK(during.current_bytes == before.current_bytes);
  const auto& live = a.groups()[0].params[0];
  CHECK(views.tensors.at("encoder.dense.weight.exp_avg").raw_data() == live.m.raw_data());
  CHECK(views.tensors.at("encoder.dense.weight.exp_avg_sq").raw_data() == live.v.raw_data());
  optimizer_state copy = a.save_state();
  CHECK(copy.tensors.at("encoder.dense.weight.exp_avg").raw_data() != live.m.raw_data());
  CHECK(dsa::memory_usage_of(dsa::device::cpu()).current_bytes == before.current_bytes + 2 * 4099 * 4);
  CHECK(same_bits(copy.tensors.at("encoder.dense.weight.exp_avg"), views.tensors.at("encoder.dense.weight.exp_avg")));
}

TEST_CASE("parse_optimizer_config: DeepSpeed keys, defaults and errors naming the key") {
  auto adam = parse(R"(
[optimizer]
type = "Adam"
[optimizer.params]
lr = 3e-5
betas = [0.8, 0.99]
eps = 1e-6
weight_decay = 0.01
bias_correction = false
)");
  auto c = parse_optimizer_config(adam);
  REQUIRE(c.has_value());
  CHECK(c->type == optimizer_type::adam);
  CHECK(c->lr == 3e-5);
  CHECK(c->beta1 == 0.8);
  CHECK(c->beta2 == 0.99);
  CHECK(c->eps == 1e-6);
  CHECK(c->weight_decay == 0.01);
  CHECK_FALSE(c->bias_correction);
  CHECK(c->decoupled_decay()); // "Adam" with the default adam_w_mode = true is AdamW
  CHECK(adam.reject_unknown().has_value());

  auto lamb = parse("[optimizer]\ntype = \"LAMB\"\n[optimizer.params]\nmax_coeff = 0.3\n");
  auto l = parse_optimizer_config(lamb);
  REQUIRE(l.has_value());
  CHECK(l->type == optimizer_type::lamb);
  CHECK(l->max_coeff == 0.3);
  CHECK(l->min_coeff == 0.01);
  CHECK(l->lr == 1e-3);

  struct bad_case {
    const char* text;
    const char* needle1;
    const char* needle2;
  };
  for (auto [text, n1, n2] : {
           bad_case{"[optimizer]\ntype = \"Adam\"\n[optimizer.params]\nlr = \"fast\"\n",
                    "optimizer.params.lr", "expected a number"},
           bad_case{"[optimizer]\ntype = \"Adam\"\n[optimizer.params]\nbetas = [0.9, 0.99, 0.9]\n",
                    "optimizer.params.betas", "two numbers"},
           bad_case{"[optimizer]\ntype = \"Adam\"\n[optimizer.params]\nweight_decy = 0.1\n",
                    "optimizer.params.weight_decy", "did you mean 'weight_decay'"},
           bad_case{"[optimizer]\ntype = \"Lamb\"\n[optimizer.params]\nadam_w_mode = true\n",
                    "optimizer.params.adam_w_mode", "unknown key"},
           bad_case{"[optimizer]\ntype = \"SGD\"\n", "optimizer.type",
                    "unknown optimizer \"SGD\" (known: Adam, AdamW, Lamb, OneBitAdam, ZeroOneAdam, OneBitLamb)"},
           bad_case{"[optimizer]\n[optimizer.params]\nlr = 1e-3\n", "optimizer.type", "missing"},
           bad_case{"[optimizer]\ntype = \"Adam\"\n[optimizer.params]\neps = 0.0\n",
                    "optimizer.params.eps", "> 0"},
       }) {
    CAPTURE(text);
    auto cfg = parse(text);
    auto r = parse_optimizer_config(cfg);
    REQUIRE_FALSE(r.has_value());
    const std::string& msg = r.err().message;
    CAPTURE(msg);
    CHECK(msg.find(n1) != std::string::npos);
    CHECK(msg.find(n2) != std::string::npos);
  }
}

TEST_CASE("optimizer: a step a parameter at a time, in any order, is step()'s bit for bit") {
  for (const auto type : {optimizer_type::adam, optimizer_type::adamw}) {
    CAPTURE(optimizer_name(type));
    optimizer_config cfg;
    cfg.type = type;
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    auto make = [&] {
      std::vector<param_slot> params;
      for (const char* n : {"a.weight", "a.bias", "b.LayerNorm.weight", "c.weight"}) {
        std::vector<float> p(37), g(37);
        for (auto& x : p) x = normal(rng);
        for (auto& x : g) x = normal(rng);
        params.push_back(slot(n, p, g));
        params.back().half_copy = tensor::empty({37}, dsa::dtype::bf16);
      }
      return params;
    };
    rng.seed(5);
    auto whole = must(optimizer::create(cfg, bert_param_groups(make(), 0.01, 1e-2)));
    rng.seed(5);
    auto each = must(optimizer::create(cfg, bert_param_groups(make(), 0.01, 1e-2)));
    for (int step = 0; step < 3; ++step) {
      whole.step();
      each.begin_step();
      for (const char* n : {"c.weight", "b.LayerNorm.weight", "a.bias", "a.weight"}) CHECK(each.step_param(n));
    }
    CHECK(each.step_count() == whole.step_count());
    for (std::size_t g = 0; g < whole.groups().size(); ++g)
      for (std::size_t i = 0; i < whole.groups()[g].params.size(); ++i) {
        const param_slot &x = whole.groups()[g].params[i], &y = each.groups()[g].params[i];
        CAPTURE(x.name);
        CHECK(same_bits(x.param, y.param));
        CHECK(same_bits(x.m, y.m));
        CHECK(same_bits(x.v, y.v));
        CHECK(same_bits(x.half_copy, y.half_copy));
      }
    auto fresh = must(optimizer::create(cfg, bert_param_groups(make(), 0.01, 1e-2)));
    const auto early = fresh.step_param("a.weight"); // no begin_step: refused
    REQUIRE_FALSE(early);
    CHECK(early.err().message.find("before begin_step()") != std::string::npos);
    const auto missing = each.step_param("no.such.weight");
    REQUIRE_FALSE(missing);
    CHECK(missing.err().message.find("no parameter 'no.such.weight'") != std::string::npos);
  }
}
