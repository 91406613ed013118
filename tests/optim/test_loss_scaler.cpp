// Tests for optim/loss_scaler and optim/grad_clip: overflow, hysteresis and growth
// sequences in both DeepSpeed flavours, DeepSpeed's log lines, and the clip factor.
#include "optim/grad_clip.hpp"
#include "optim/loss_scaler.hpp"

#include "core/half.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace {

using namespace dsa::optim;

loss_scaler_params small(loss_scaler_flavour flavour) {
  loss_scaler_params p;
  p.initial_scale_power = 4; // 16
  p.loss_scale_window = 3;
  p.hysteresis = 2;
  p.min_loss_scale = 1.0;
  p.flavour = flavour;
  return p;
}

loss_scale_update must(dsa::expected<loss_scale_update> u) {
  if (!u) FAIL(u.err().to_string());
  return *u;
}

} // namespace

TEST_CASE("loss scaler: DeepSpeed's overflow log line") {
  loss_scaler_params p; // 2^16, hysteresis 2
  p.flavour = loss_scaler_flavour::fp16_optimizer;
  loss_scaler s(p);
  CHECK(s.scale() == 65536.0);
  auto u = must(s.update(true));
  CHECK(u.skip_step);
  CHECK(u.message == "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768");
  CHECK(s.scale() == 32768.0);
  loss_scaler r3(p, 3);
  CHECK(must(r3.update(true)).message.find("OVERFLOW! Rank 3 Skipping step.") != std::string::npos);
}

TEST_CASE("loss scaler, ZeRO flavour: hysteresis, then halving, then growth after the window") {
  loss_scaler s(small(loss_scaler_flavour::zero));
  // it 0: overflow, hysteresis 2 -> 1, scale kept
  auto u = must(s.update(true));
  CHECK(u.skip_step);
  CHECK(u.message == "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 16, but hysteresis is 2. "
                     "Reducing hysteresis to 1");
  CHECK(s.scale() == 16.0);
  CHECK(s.state().cur_hysteresis == 1);
  // it 1: overflow with hysteresis 1: halve
  u = must(s.update(true));
  CHECK(u.message == "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 16, reducing to 8");
  CHECK(s.scale() == 8.0);
  CHECK(s.state().last_overflow_iter == 1);
  // it 2..5 clean: stable = it - 1 - 1 = 0, 1, 2, 3 -> grows at it 5 (3 % 3 == 0), hysteresis refilled
  std::vector<double> scales;
  for (int i = 0; i < 4; ++i) {
    u = must(s.update(false));
    CHECK_FALSE(u.skip_step);
    CHECK(u.message.empty());
    scales.push_back(s.scale());
  }
  CHECK(scales == std::vector<double>{8, 8, 8, 16});
  CHECK(s.state().cur_hysteresis == 2);
  // Without consecutive hysteresis a clean step in between does not refill it.
  must(s.update(true)); // hysteresis 2 -> 1
  must(s.update(false));
  must(s.update(true)); // halves
  CHECK(s.scale() == 8.0);
}

TEST_CASE("loss scaler, ZeRO flavour: consecutive hysteresis refills on every clean step") {
  auto p = small(loss_scaler_flavour::zero);
  p.consecutive_hysteresis = true;
  loss_scaler s(p);
  must(s.update(true)); // 2 -> 1
  must(s.update(false)); // refilled to 2
  CHECK(s.state().cur_hysteresis == 2);
  auto u = must(s.update(true)); // 2 -> 1 again, scale kept
  CHECK(u.message.find("but hysteresis is 2") != std::string::npos);
  CHECK(s.scale() == 16.0);
}

TEST_CASE("loss scaler, ZeRO flavour: an overflow at the minimum scale is an error") {
  loss_scaler_params p;
  p.initial_scale_power = 3; // 8
  p.hysteresis = 1;
  p.min_loss_scale = 4.0;
  loss_scaler s(p);
  must(s.update(true)); // 8 -> 4
  CHECK(s.scale() == 4.0);
  auto u = s.update(true);
  REQUIRE_FALSE(u.has_value());
  CHECK(u.err().message == "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.");
}

TEST_CASE("loss scaler, FP16_Optimizer flavour: no hysteresis, floor at min scale, growth") {
  loss_scaler s(small(loss_scaler_flavour::fp16_optimizer));
  auto u = must(s.update(true)); // halves at once despite hysteresis 2
  CHECK(u.message == "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 16, reducing to 8");
  for (int i = 0; i < 3; ++i) must(s.update(true));
  CHECK(s.scale() == 1.0); // 8 -> 4 -> 2 -> 1
  u = must(s.update(true)); // at the floor: stays, no error
  CHECK(u.message == "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1, reducing to 1");
  CHECK(s.scale() == 1.0);
  // last overflow at it 4; clean its 5.. : stable 0,1,2,3 -> doubles at it 8, then 6 -> it 11
  std::vector<double> scales;
  for (int i = 0; i < 7; ++i) {
    must(s.update(false));
    scales.push_back(s.scale());
  }
  CHECK(scales == std::vector<double>{1, 1, 1, 2, 2, 2, 4});
}

TEST_CASE("loss scaler: growth from the start waits one step more than the window") {
  auto p = small(loss_scaler_flavour::zero);
  p.loss_scale_window = 2;
  loss_scaler s(p);
  std::vector<double> scales;
  for (int i = 0; i < 5; ++i) {
    must(s.update(false));
    scales.push_back(s.scale());
  }
  // it 0: stable 0; it 1: 1; it 2: 2 -> x2; it 3: 3; it 4: 4 -> x2
  CHECK(scales == std::vector<double>{16, 16, 32, 32, 64});
}

TEST_CASE("loss scaler: static scale skips on overflow and never changes") {
  loss_scaler_params p;
  p.loss_scale = 128.0;
  loss_scaler s(p);
  CHECK_FALSE(s.dynamic());
  CHECK(s.scale() == 128.0);
  auto u = must(s.update(true));
  CHECK(u.skip_step);
  CHECK(s.scale() == 128.0);
  for (int i = 0; i < 5000; ++i) must(s.update(false));
  CHECK(s.scale() == 128.0);
}

TEST_CASE("loss scaler: state round trip and fp16 config") {
  loss_scaler a(small(loss_scaler_flavour::zero));
  must(a.update(true));
  must(a.update(false));
  loss_scaler b(small(loss_scaler_flavour::zero));
  b.load_state(a.state());
  for (bool overflow : {true, false, false, false, true, true}) {
    auto ua = must(a.update(overflow)), ub = must(b.update(overflow));
    CHECK(ua.message == ub.message);
    CHECK(a.scale() == b.scale());
  }
  auto cfg = dsa::config::parse("[fp16]\nenabled = true\ninitial_scale_power = 12\nhysteresis = 3\n", "t.toml");
  REQUIRE(cfg.has_value());
  auto p = parse_loss_scaler_params(*cfg, loss_scaler_flavour::zero);
  REQUIRE(p.has_value());
  CHECK(loss_scaler(*p).scale() == 4096.0);
  CHECK(p->hysteresis == 3);
  CHECK(p->loss_scale_window == 1000);
  auto bad = dsa::config::parse("[fp16]\nloss_scale_window = 0\n", "t.toml");
  auto e = parse_loss_scaler_params(*bad, loss_scaler_flavour::zero);
  REQUIRE_FALSE(e.has_value());
  CHECK(e.err().message.find("fp16.loss_scale_window") != std::string::npos);
}

TEST_CASE("grad_clip: global norm across buffers of different types and partial sums") {
  std::vector<float> a{3.0f}, b{4.0f, 0.0f};
  std::vector<std::uint16_t> c{dsa::f32_to_f16(12.0f)};
  grad_norm whole;
  whole.add_buffer(a.data(), dsa::dtype::f32, 1);
  whole.add_buffer(b.data(), dsa::dtype::f32, 2);
  whole.add_buffer(c.data(), dsa::dtype::f16, 1);
  CHECK(whole.norm() == 13.0); // sqrt(9 + 16 + 144)
  // Stages contribute partial sums of squares; the owner adds them.
  grad_norm parts;
  parts.add_partial(sum_of_squares(a.data(), dsa::dtype::f32, 1) + sum_of_squares(b.data(), dsa::dtype::f32, 2));
  parts.add_partial(sum_of_squares(c.data(), dsa::dtype::f16, 1));
  CHECK(parts.norm() == whole.norm());
  CHECK(parts.finite());
  b[1] = std::numeric_limits<float>::infinity();
  grad_norm inf;
  inf.add_buffer(b.data(), dsa::dtype::f32, 2);
  CHECK_FALSE(inf.finite());
  std::vector<std::uint16_t> nan{dsa::f32_to_bf16(std::nanf(""))};
  CHECK(std::isnan(sum_of_squares(nan.data(), dsa::dtype::bf16, 1)));
}

TEST_CASE("grad_clip: DeepSpeed's combined unscale + clip factor") {
  // Scaled norm G = 13 * 1024, scale 1024, clip 1: clip = (13 + 1e-6)/1 > 1 -> combined = 1024 (13 + 1e-6)
  CHECK(combined_unscale_clip(13.0 * 1024, 1024.0, 1.0) == doctest::Approx(1024.0 * (13.0 + 1e-6)));
  CHECK(unscaled_norm(13.0 * 1024, 1024.0) == 13.0);
  // Below the clip: (0.5 + 1e-6)/1 <= 1 -> plain unscale
  CHECK(combined_unscale_clip(0.5 * 1024, 1024.0, 1.0) == 1024.0);
  // Clipping off
  CHECK(combined_unscale_clip(1e9, 8.0, 0.0) == 8.0);
  // After scaling by 1/combined the unscaled norm is clip_grad / (1 + 1e-6 / norm) ~ clip_grad.
  std::vector<float> g{3.0f * 1024, 4.0f * 1024};
  double G = std::sqrt(sum_of_squares(g.data(), dsa::dtype::f32, 2));
  scale_in_place(g.data(), 1.0 / combined_unscale_clip(G, 1024.0, 2.0), 2);
  CHECK(std::hypot(g[0], g[1]) == doctest::Approx(2.0).epsilon(1e-6));
}
