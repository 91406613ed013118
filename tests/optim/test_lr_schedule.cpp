// Tests for optim/lr_schedule: every schedule against values worked out from DeepSpeed's
// formulas, and the config factory's errors.
#include "optim/lr_schedule.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <memory>

namespace {

using namespace dsa::optim;

std::unique_ptr<lr_schedule> must(dsa::expected<std::unique_ptr<lr_schedule>> made) {
  if (!made) FAIL(made.err().to_string());
  return std::move(*made);
}

// lr after `steps` calls to step() from a fresh schedule.
double lr_after(lr_schedule& s, std::int64_t steps) {
  s.set_last_batch_iteration(-1);
  for (std::int64_t i = 0; i < steps; ++i) s.step();
  return s.lr();
}

dsa::config parse(const char* text) {
  auto c = dsa::config::parse(text, "test.toml");
  REQUIRE(c.has_value());
  return std::move(*c);
}

} // namespace

TEST_CASE("WarmupLR log: the first two optimizer steps run at warmup_min_lr") {
  warmup_lr_params p;
  p.warmup_min_lr = 0.0;
  p.warmup_max_lr = 0.01;
  p.warmup_num_steps = 10;
  auto s = must(make_warmup_lr(p, 1.0));
  CHECK(s->last_batch_iteration() == -1);
  CHECK(s->lr() == 0.0); // construction: t = -1 -> min
  s->step();
  CHECK(s->lr() == 0.0); // t = 0: ln(1) / ln(10) = 0 -> min
  s->step();             // t = 1: 0.01 * ln 2 / ln 10 = 0.0030103
  CHECK(s->lr() == doctest::Approx(0.01 * std::log(2.0) / std::log(10.0)));
  CHECK(s->lr() == doctest::Approx(0.0030103).epsilon(1e-4));
  CHECK(lr_after(*s, 3) == doctest::Approx(0.01 * std::log(3.0) / std::log(10.0))); // t = 2
  CHECK(lr_after(*s, 10) == doctest::Approx(0.01));                                  // t = 9: ln10/ln10
  CHECK(lr_after(*s, 11) == 0.01);                                                   // t = 10: gamma 1
  CHECK(lr_after(*s, 500) == 0.01);
  CHECK(std::string(s->name()) == "WarmupLR");
  CHECK_FALSE(s->momentum().has_value());
}

TEST_CASE("WarmupLR linear, default max from the optimizer, warmup_num_steps forced >= 2") {
  warmup_lr_params p;
  p.warmup_min_lr = 0.001;
  p.warmup_max_lr = 0.002;
  p.warmup_num_steps = 4;
  p.type = warmup_type::linear;
  auto s = must(make_warmup_lr(p, 1.0));
  CHECK(lr_after(*s, 1) == doctest::Approx(0.001));   // t = 0: 0/4
  CHECK(lr_after(*s, 2) == doctest::Approx(0.00125)); // t = 1: 1/4
  CHECK(lr_after(*s, 4) == doctest::Approx(0.00175)); // t = 3: 3/4
  CHECK(lr_after(*s, 5) == doctest::Approx(0.002));   // t = 4: done
  warmup_lr_params d; // min 0, max none, 1000 steps, log
  auto s2 = must(make_warmup_lr(d, 5e-5));
  CHECK(lr_after(*s2, 1001) == doctest::Approx(5e-5));
  warmup_lr_params one;
  one.warmup_num_steps = 1; // DeepSpeed: max(2, 1) = 2
  one.warmup_max_lr = 1.0;
  one.type = warmup_type::linear;
  auto s3 = must(make_warmup_lr(one, 1.0));
  CHECK(lr_after(*s3, 2) == doctest::Approx(0.5)); // t = 1: 1/2
  CHECK(lr_after(*s3, 3) == 1.0);
  warmup_lr_params bad;
  bad.warmup_num_steps = 0;
  CHECK_FALSE(make_warmup_lr(bad, 1.0).has_value());
}

TEST_CASE("WarmupDecayLR: linear warm-up then linear decay to zero") {
  warmup_decay_lr_params p;
  p.total_num_steps = 20;
  p.warmup_num_steps = 10;
  p.warmup_max_lr = 0.01;
  p.type = warmup_type::linear;
  auto s = must(make_warmup_decay_lr(p));
  CHECK(lr_after(*s, 1) == 0.0);                    // t = 0
  CHECK(lr_after(*s, 6) == doctest::Approx(0.005)); // t = 5: 5/10
  CHECK(lr_after(*s, 11) == doctest::Approx(0.01)); // t = 10: (20-10)/(20-10) = 1
  CHECK(lr_after(*s, 16) == doctest::Approx(0.005)); // t = 15: 5/10
  CHECK(lr_after(*s, 21) == 0.0);                    // t = 20
  CHECK(lr_after(*s, 26) == 0.0);                    // t = 25: max(0, -0.5)
  warmup_decay_lr_params missing;
  CHECK_FALSE(make_warmup_decay_lr(missing).has_value());
}

TEST_CASE("WarmupCosineLR: ratio of the optimizer lr, 0 before the first step") {
  warmup_cosine_lr_params p;
  p.total_num_steps = 10;
  p.warmup_num_steps = 4;
  p.warmup_min_ratio = 0.1;
  p.cos_min_ratio = 0.01;
  p.type = warmup_type::linear;
  auto s = must(make_warmup_cosine_lr(p, 0.1));
  CHECK(s->lr() == 0.0);                              // t = -1
  CHECK(lr_after(*s, 1) == doctest::Approx(0.01));    // t = 0: 0.1 * (0.1 + 0 * 0.9)
  CHECK(lr_after(*s, 3) == doctest::Approx(0.055));   // t = 2: 0.1 * (0.1 + 0.5 * 0.9)
  // t = 4: progress (4-4+1)/(10-4) = 1/6; (1 + cos(pi/6))/2 = 0.9330127; 0.01 + 0.99 * 0.9330127 = 0.9336826
  CHECK(lr_after(*s, 5) == doctest::Approx(0.1 * (0.01 + 0.99 * (1 + std::cos(std::acos(-1.0) / 6)) / 2)));
  CHECK(lr_after(*s, 5) == doctest::Approx(0.09336826).epsilon(1e-6));
  CHECK(lr_after(*s, 10) == doctest::Approx(0.001)); // t = 9: progress 1 -> cos_min_ratio
  CHECK(lr_after(*s, 13) == doctest::Approx(0.001)); // t = 12: clamped, no oscillation
}

TEST_CASE("OneCycle: cycle, decay and the momentum quirk beta2 = 0.99") {
  one_cycle_params p;
  p.cycle_min_lr = 0.01;
  p.cycle_max_lr = 0.1;
  p.cycle_first_step_size = 4; // second defaults to 4: total 8, ratio 0.5
  p.decay_step_size = 2;
  p.decay_lr_rate = 0.5;
  p.decay_mom_rate = 0.1;
  auto s = must(make_one_cycle(p));
  CHECK(s->lr() == 0.01); // t = -1: min lr, betas (min_mom, 0.99)
  CHECK(s->momentum()->beta1 == 0.8);
  CHECK(s->momentum()->beta2 == 0.99);
  // t = 0: i = 1, x = 1/8, scale = 0.125/0.5 = 0.25: lr = 0.01 + 0.09*0.25, mom = 0.9 - 0.1*0.25
  CHECK(lr_after(*s, 1) == doctest::Approx(0.0325));
  CHECK(s->momentum()->beta1 == doctest::Approx(0.875));
  CHECK(s->momentum()->beta2 == 0.99);
  CHECK(lr_after(*s, 4) == doctest::Approx(0.1)); // t = 3: x = 0.5, scale 1
  CHECK(s->momentum()->beta1 == doctest::Approx(0.8));
  // t = 5: x = 0.75, scale = (0.75 - 1)/(0.5 - 1) = 0.5
  CHECK(lr_after(*s, 6) == doctest::Approx(0.055));
  CHECK(s->momentum()->beta1 == doctest::Approx(0.85));
  CHECK(lr_after(*s, 8) == doctest::Approx(0.01)); // t = 7: i = 8, cycle 2, x = 0
  CHECK(s->momentum()->beta1 == doctest::Approx(0.9));
  // t = 8 >= total: interval (8 - 8 + 1)/2 = 0.5: lr = 0.01/(1 + 0.5*0.5), mom = 0.9 (1 + 0.1*0.5)
  CHECK(lr_after(*s, 9) == doctest::Approx(0.008));
  CHECK(s->momentum()->beta1 == doctest::Approx(0.945));
  CHECK(lr_after(*s, 12) == doctest::Approx(0.005)); // t = 11: interval 2
  CHECK(s->momentum()->beta1 == doctest::Approx(1.08));
}

TEST_CASE("OneCycle: no decay by default, staircase, momentum off") {
  one_cycle_params p;
  p.cycle_min_lr = 0.01;
  p.cycle_max_lr = 0.1;
  p.cycle_first_step_size = 4;
  auto plain = must(make_one_cycle(p));
  CHECK(lr_after(*plain, 9) == doctest::Approx(0.01)); // t = 8: decay off -> min lr
  CHECK(plain->momentum()->beta1 == 0.9);               // and max momentum
  p.cycle_first_stair_count = 2; // second stair count defaults to the first
  auto stairs = must(make_one_cycle(p));
  CHECK(lr_after(*stairs, 1) == doctest::Approx(0.01));  // i = 1: position 1*2/4 = 0.5 -> 0
  CHECK(lr_after(*stairs, 2) == doctest::Approx(0.055)); // i = 2: position 1 -> 0.5
  CHECK(lr_after(*stairs, 4) == doctest::Approx(0.1));   // i = 4: position 2 -> 1
  CHECK(lr_after(*stairs, 5) == doctest::Approx(0.055)); // i = 5: (8-5)*2/4 = 1.5 -> 0.5
  p.cycle_momentum = false;
  auto no_mom = must(make_one_cycle(p));
  CHECK_FALSE(no_mom->momentum().has_value());
}

TEST_CASE("LRRangeTest: continuous and staircase") {
  lr_range_test_params p;
  p.lr_range_test_min_lr = 1e-3;
  p.lr_range_test_step_size = 2;
  auto s = must(make_lr_range_test(p));
  CHECK(s->lr() == 1e-3);                            // t = -1
  CHECK(lr_after(*s, 1) == doctest::Approx(1.5e-3)); // t = 0: 1 + 1/2
  CHECK(lr_after(*s, 2) == doctest::Approx(2e-3));   // t = 1: 1 + 2/2
  CHECK(lr_after(*s, 5) == doctest::Approx(3.5e-3)); // t = 4: 1 + 5/2
  p.lr_range_test_staircase = true;
  auto st = must(make_lr_range_test(p));
  CHECK(lr_after(*st, 1) == doctest::Approx(1e-3)); // floor(0.5) = 0
  CHECK(lr_after(*st, 3) == doctest::Approx(2e-3)); // floor(1.5) = 1
  CHECK(lr_after(*st, 4) == doctest::Approx(3e-3)); // floor(2) = 2
}

TEST_CASE("make_lr_schedule: from a config, with errors naming the key") {
  auto ok = parse(R"(
[scheduler]
type = "WarmupDecayLR"
[scheduler.params]
total_num_steps = 20
warmup_max_lr = 0.01
warmup_num_steps = 10
warmup_type = "linear"
)");
  auto s = must(make_lr_schedule(ok, 1.0));
  CHECK(std::string(s->name()) == "WarmupDecayLR");
  CHECK(lr_after(*s, 6) == doctest::Approx(0.005));
  CHECK(ok.reject_unknown().has_value());

  auto warm = parse("[scheduler]\ntype = \"WarmupLR\"\n[scheduler.params]\nwarmup_num_steps = 10\n");
  auto w = must(make_lr_schedule(warm, 0.02)); // warmup_max_lr defaults to the optimizer's lr
  CHECK(lr_after(*w, 20) == doctest::Approx(0.02));

  struct bad_case {
    const char* text;
    const char* needle1;
    const char* needle2;
  };
  for (auto [text, n1, n2] : {
           bad_case{"[scheduler]\ntype = \"WarmupLR\"\n[scheduler.params]\nwarmup_num_steps = \"ten\"\n",
                    "scheduler.params.warmup_num_steps", "expected an integer"},
           bad_case{"[scheduler]\ntype = \"WarmupLR\"\n[scheduler.params]\nwarmup_num_step = 10\n",
                    "scheduler.params.warmup_num_step", "did you mean 'warmup_num_steps'"},
           bad_case{"[scheduler]\ntype = \"Cosine\"\n", "scheduler.type", "unknown scheduler"},
           bad_case{"[scheduler]\ntype = \"WarmupDecayLR\"\n[scheduler.params]\nwarmup_num_steps = 10\n",
                    "scheduler.params.total_num_steps", "missing"},
           bad_case{"[scheduler]\ntype = \"WarmupLR\"\n[scheduler.params]\nwarmup_type = \"cosine\"\n",
                    "scheduler.params.warmup_type", "linear"},
           bad_case{"[scheduler]\ntype = \"OneCycle\"\n[scheduler.params]\ncycle_min_lr = 0.1\n",
                    "scheduler.params.cycle_max_lr", "missing"},
           bad_case{"[scheduler]\ntype = \"WarmupLR\"\n[scheduler.params]\nwarmup_num_steps = 0\n",
                    "scheduler.params.warmup_num_steps", "positive"},
       }) {
    CAPTURE(text);
    auto cfg = parse(text);
    auto made = make_lr_schedule(cfg, 1.0);
    REQUIRE_FALSE(made.has_value());
    const std::string& msg = made.err().message;
    CAPTURE(msg);
    CHECK(msg.find(n1) != std::string::npos);
    CHECK(msg.find(n2) != std::string::npos);
  }
}

TEST_CASE("lr_schedule state is last_batch_iteration alone") {
  warmup_lr_params p;
  p.warmup_max_lr = 0.01;
  p.warmup_num_steps = 10;
  auto a = must(make_warmup_lr(p, 1.0)), b = must(make_warmup_lr(p, 1.0));
  for (int i = 0; i < 7; ++i) a->step();
  b->set_last_batch_iteration(a->last_batch_iteration());
  CHECK(b->lr() == a->lr());
  a->step();
  b->step();
  CHECK(b->lr() == a->lr());
}
