// Working weights and stashed activations in f16/bf16: half the bytes of f32,
// weights widened bit-exactly (the same losses and gradients as an f32 model
// holding the rounded values), and gradients from half-stashed activations
// within the f16/bf16 tolerances of the f32 stash.
#include "tests/models/bert_fixture.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/run_notes.hpp"
#include "tests/support/tolerances.hpp"

#include "core/memory_stats.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/gemm_bf16.hpp"
#include "models/bert/bert_state.hpp"

#include <doctest/doctest.h>

#include <map>

namespace {

using namespace dsa;
using bert::head_kind;
using bert::layer_norm_placement;

bert::bert_config dropout_bert(layer_norm_placement norm, head_kind head, bool all_flags) {
  bert::bert_config cfg = test::small_bert(norm, head);
  cfg.hidden_dropout = 0.1f;
  cfg.attention_dropout = 0.1f;
  cfg.memory.normalize_invertible = all_flags;
  cfg.memory.attn_dropout_checkpoint = all_flags;
  cfg.memory.gelu_checkpoint = all_flags;
  return cfg;
}

bert::forward_context train_ctx(dtype stash_type) {
  bert::forward_context ctx;
  ctx.seed = 77;
  ctx.step = 3;
  ctx.stash_type = stash_type;
  return ctx;
}

struct step_result {
  double loss = 0;
  std::size_t stash_bytes = 0;       // the whole part's stash after forward
  std::size_t layer_stash_bytes = 0; // layer 0's
  std::map<std::string, std::vector<float>> grads;
};

step_result step(bert::bert_part& part, const bert::forward_context& ctx) {
  const bert::bert_batch batch = test::small_batch(part.config());
  bert::part_stash stash;
  auto out = part.forward(tensor{}, batch, ctx, stash);
  REQUIRE(out.has_value());
  step_result r;
  r.loss = out->losses.total;
  r.stash_bytes = stash.bytes();
  r.layer_stash_bytes = stash.layers.at(0).bytes();
  part.parameters().zero_grad();
  part.backward(tensor{}, stash, bert::backward_options{});
  for (const auto& e : part.parameters().entries())
    r.grads[e.spec.name].assign(e.grad.data<float>(), e.grad.data<float>() + e.grad.numel());
  return r;
}

// An f32 part holding exactly the values of `half` (widening is exact).
void copy_values(bert::bert_part& f32, const bert::bert_part& half) {
  auto loaded = bert::load_state(f32.parameters(), bert::state(half.parameters()));
  REQUIRE(loaded.has_value());
}

// The same loss and, parameter by parameter, the same gradients (but those `except` names).
void check_same(const step_result& a, const step_result& b, bool (*except)(const std::string&) = nullptr) {
  CHECK(a.loss == b.loss);
  for (const auto& [name, g] : a.grads) {
    if (except && except(name))
      continue;
    INFO(name);
    CHECK(g == b.grads.at(name));
  }
}

test::tolerance stash_tolerance(dtype t) {
  return t == dtype::f16 ? test::f16_stash : test::bf16_stash;
}

} // namespace

TEST_CASE("bert working weights in f16/bf16 take exactly half the bytes of f32") {
  for (auto norm : {layer_norm_placement::post, layer_norm_placement::pre}) {
    const bert::bert_config cfg = test::small_bert(norm, head_kind::pretraining);
    const auto range = bert::bert_range::whole(cfg);
    const auto before = memory_usage_of(device::cpu()).current_bytes;
    bert::bert_parameters f32(cfg, range, dtype::f32);
    const auto f32_allocated = memory_usage_of(device::cpu()).current_bytes - before;
    for (dtype t : {dtype::f16, dtype::bf16}) {
      CAPTURE(std::string(dtype_name(t)));
      const auto start = memory_usage_of(device::cpu()).current_bytes;
      bert::bert_parameters half(cfg, range, t);
      const auto half_allocated = memory_usage_of(device::cpu()).current_bytes - start;
      CHECK(half.value_type() == t);
      CHECK(half.value_bytes() * 2 == f32.value_bytes());
      CHECK(half.value_bytes() == static_cast<std::size_t>(half.count()) * 2);
      for (const auto& e : half.entries())
        CHECK(e.value.type() == t);
      // The accounting sees the same: values halve, the f32 gradients do not change.
      CHECK(f32_allocated - half_allocated == static_cast<std::int64_t>(half.value_bytes()));
    }
  }
}

TEST_CASE("bert init in f16/bf16 holds the f32 init rounded to nearest even") {
  const bert::bert_config cfg = test::small_bert(layer_norm_placement::post, head_kind::squad);
  const auto range = bert::bert_range::whole(cfg);
  bert::bert_parameters f32(cfg, range);
  f32.init(9);
  for (dtype t : {dtype::f16, dtype::bf16}) {
    bert::bert_parameters half(cfg, range, t);
    half.init(9);
    for (std::size_t i = 0; i < half.entries().size(); ++i) {
      const auto& h = half.entries()[i];
      INFO(h.spec.name << " " << dtype_name(t));
      std::vector<std::uint16_t> want(static_cast<std::size_t>(h.value.numel()));
      cpu::cast(want.data(), t, f32.entries()[i].value.raw_data(), dtype::f32, h.value.numel());
      CHECK(std::equal(want.begin(), want.end(), h.value.data<std::uint16_t>()));
    }
  }
}

TEST_CASE("bert with f16/bf16 weights: the same loss and gradients as f32 holding the rounded "
          "values") {
  for (auto norm : {layer_norm_placement::post, layer_norm_placement::pre}) {
    for (auto head : {head_kind::pretraining, head_kind::squad}) {
      for (dtype t : {dtype::f16, dtype::bf16}) {
        CAPTURE(static_cast<int>(norm));
        CAPTURE(static_cast<int>(head));
        CAPTURE(std::string(dtype_name(t)));
        const bert::bert_config cfg = dropout_bert(norm, head, false);
        bert::bert_part half(cfg, bert::bert_range::whole(cfg), t);
        test::randomize_parameters(half.parameters(), 21);
        bert::bert_part f32(cfg, bert::bert_range::whole(cfg));
        copy_values(f32, half);
        check_same(step(half, train_ctx(dtype::f32)), step(f32, train_ctx(dtype::f32)));
      }
    }
  }
}

// With bf16 GEMM operands on (bf16.cpu_gemm) the bf16 weights and stashed activations go to
// the products as they are (stored_precision.hpp's gemm_input): the same bits as the f32
// part, whose f32 weights the mode rounds, exactly, to those values.
TEST_CASE("bert with bf16 weights and bf16 GEMM operands: the same loss and gradients as f32 weights") {
  if (!cpu::bf16_gemm_supported()) return dsa::test::skip_for_cpu("AVX512_BF16 or AMX", "no bf16 GEMM");
  cpu::bf16_operands_scope on(true);
  for (auto head : {head_kind::pretraining, head_kind::squad}) {
    for (bool flags : {false, true}) {
      CAPTURE(static_cast<int>(head));
      CAPTURE(flags);
      const bert::bert_config cfg = dropout_bert(layer_norm_placement::post, head, flags);
      bert::bert_part half(cfg, bert::bert_range::whole(cfg), dtype::bf16);
      test::randomize_parameters(half.parameters(), 45);
      bert::bert_part f32(cfg, bert::bert_range::whole(cfg));
      copy_values(f32, half);
      const step_result a = step(half, train_ctx(dtype::bf16));
      check_same(a, step(f32, train_ctx(dtype::bf16)));
      // With GELU kept, the fused pass writes the bf16 ff1 and GELU stash directly; with
      // gelu_checkpoint the layer takes the unfused path and the output projection rounds the
      // f32 GELU itself. The forward is the same bits either way. In backward only the output
      // projection's weight gradient may differ: checkpointed, it reads the GELU recomputed
      // from the bf16 ff1.
      bert::bert_config other = cfg;
      other.memory.gelu_checkpoint = !cfg.memory.gelu_checkpoint;
      bert::bert_part half_other(other, bert::bert_range::whole(other), dtype::bf16);
      copy_values(half_other, half);
      check_same(a, step(half_other, train_ctx(dtype::bf16)), [](const std::string& name) {
        return name.find("output.dense.weight") != std::string::npos && name.find("attention") == std::string::npos;
      });
      // And the products are bf16 ones: the loss moves from the f32 products'.
      cpu::bf16_operands_scope off(false);
      CHECK(step(half, train_ctx(dtype::bf16)).loss != a.loss);
    }
  }
}

TEST_CASE("bert activations stashed in f16/bf16: the same loss, gradients within tolerance, "
          "stash values in half the bytes") {
  const std::int64_t B = 2, T = 7;
  for (auto norm : {layer_norm_placement::post, layer_norm_placement::pre}) {
    for (auto head : {head_kind::pretraining, head_kind::squad}) {
      for (bool flags : {false, true}) {
        for (dtype t : {dtype::f16, dtype::bf16}) {
          CAPTURE(static_cast<int>(norm));
          CAPTURE(static_cast<int>(head));
          CAPTURE(flags);
          CAPTURE(std::string(dtype_name(t)));
          const bert::bert_config cfg = dropout_bert(norm, head, flags);
          bert::bert_part part(cfg, bert::bert_range::whole(cfg), t);
          test::randomize_parameters(part.parameters(), 33);
          const step_result full = step(part, train_ctx(dtype::f32));
          const step_result half = step(part, train_ctx(t));
          // Forward computes in f32 whatever is stashed: the loss is bit-identical.
          CHECK(half.loss == full.loss);
          for (const auto& [name, g] : half.grads) {
            INFO(name);
            const auto& ref = full.grads.at(name);
            DSA_CHECK_CLOSE(g.data(), ref.data(), static_cast<std::int64_t>(g.size()),
                            stash_tolerance(t));
          }
          CHECK(half.layer_stash_bytes ==
                bert::layer_stash_bytes(cfg, B, T, bert::run_mode::train, t));
          CHECK(full.layer_stash_bytes ==
                bert::layer_stash_bytes(cfg, B, T, bert::run_mode::train, dtype::f32));
          CHECK(half.stash_bytes < full.stash_bytes);
        }
      }
    }
  }
}

TEST_CASE("bert stash bytes in f16/bf16: activations halve, per-row statistics stay f32") {
  const std::int64_t B = 2, T = 7;
  const std::size_t N = B * T;
  for (bool invertible : {false, true}) {
    bert::bert_config cfg = dropout_bert(layer_norm_placement::post, head_kind::pretraining, false);
    cfg.memory.normalize_invertible = invertible;
    const std::size_t f32 = bert::layer_stash_bytes(cfg, B, T, bert::run_mode::train);
    const std::size_t stats = (invertible ? 2 : 4) * N * sizeof(float); // rstd (and mean) x 2
    for (dtype t : {dtype::f16, dtype::bf16})
      CHECK(bert::layer_stash_bytes(cfg, B, T, bert::run_mode::train, t) ==
            (f32 - stats) / 2 + stats);
  }
}
