// The encoder layer's fused sublayer exits (cpu::residual_layernorm_forward) against the
// kernels they replace, composed by hand as the layer composed them before: the output and
// every stashed tensor bit for bit, pre- and post-LN, f32 and bf16 stashes (bf16 with bf16
// GEMM operands where the CPU has them), with and without normalize_invertible.
#include "tests/models/bert_fixture.hpp"
#include "tests/support/random.hpp"
#include "tests/support/run_notes.hpp"

#include "kernels/cpu/bias.hpp"
#include "kernels/cpu/dropout.hpp"
#include "kernels/cpu/gemm_bf16.hpp"
#include "kernels/cpu/layernorm.hpp"
#include "models/bert/attention.hpp"
#include "models/bert/encoder_layer.hpp"
#include "models/bert/feed_forward.hpp"
#include "models/bert/linear.hpp"
#include "models/bert/stored_precision.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace dsa;
using bert::layer_norm_placement;

std::vector<std::uint8_t> bytes_of(const tensor& t) {
  if (!t.defined()) return {};
  const auto* p = static_cast<const std::uint8_t*>(t.raw_data());
  return {p, p + t.nbytes()};
}

tensor rows(std::int64_t n, std::int64_t c) { return tensor::empty({n, c}, dtype::f32); }

// LayerNorm of x into a new tensor, its statistics into mean and rstd.
tensor norm(const tensor& x, const bert::layernorm_params& p, float eps, tensor& mean, tensor& rstd) {
  const std::int64_t N = x.dim(0), C = x.dim(1);
  tensor y = rows(N, C);
  mean = tensor::empty({N}, dtype::f32);
  rstd = tensor::empty({N}, dtype::f32);
  cpu::layernorm_forward(y.data<float>(), mean.data<float>(), rstd.data<float>(), x.data<float>(),
                         p.weight.data<float>(), p.bias.data<float>(), eps, N, C);
  return y;
}

// residual + dropout(product + bias) as bias_add then dropout_residual_forward.
tensor exit_sum(tensor& product, const bert::linear_params& proj, const tensor& residual, float p,
                const philox_stream& stream) {
  const std::int64_t N = residual.dim(0), C = residual.dim(1);
  cpu::bias_add(product.data<float>(), proj.bias.data<float>(), N, C);
  tensor sum = rows(N, C);
  cpu::dropout_residual_forward(sum.data<float>(), product.data<float>(), residual.data<float>(), p, stream, N * C);
  return sum;
}

// The layer forward with separate kernels (the stash as the fused layer fills it).
tensor unfused_layer(const tensor& x, const float* mask, const bert::layer_params& stored, const bert::bert_config& cfg,
                     std::uint32_t id, std::int64_t seq, const bert::forward_context& ctx, bert::layer_stash& s) {
  const bert::layer_params p = bert::widen(stored);
  const bert::attention_dims dims{x.dim(0) / seq, seq, cfg.hidden_size, cfg.num_heads};
  const std::int64_t N = x.dim(0), H = cfg.hidden_size;
  const float hidden_p = ctx.rate(cfg.hidden_dropout), eps = cfg.layer_norm_eps;
  const dtype kt = ctx.stash_type;
  const bool inv = cfg.memory.normalize_invertible;
  tensor branch = rows(N, H), mean, rstd;
  auto keep_norm = [&](const tensor& in, tensor& in_kept, tensor& mean_kept, tensor& rstd_kept) {
    rstd_kept = rstd;
    if (!inv) {
      in_kept = bert::keep(in, kt);
      mean_kept = mean;
    }
  };
  s.ctx = ctx;
  if (cfg.norm == layer_norm_placement::post) {
    s.attention.x = bert::keep(x, kt);
    bert::attention_forward(branch.data<float>(), s.attention, x, mask, p, dims, ctx.rate(cfg.attention_dropout),
                            ctx.stream(id, bert::site::attention_probs), cfg.memory, kt);
    const tensor sum = exit_sum(branch, p.attention_out, x, hidden_p, ctx.stream(id, bert::site::attention_output));
    const tensor h = norm(sum, p.attention_norm, eps, mean, rstd);
    keep_norm(sum, s.norm_a_in, s.norm_a_mean, s.norm_a_rstd);
    s.feed_forward.x = bert::keep(h, kt);
    bert::feed_forward_forward(branch.data<float>(), s.feed_forward, h, p, cfg.memory, kt);
    const tensor sum2 = exit_sum(branch, p.output, h, hidden_p, ctx.stream(id, bert::site::ffn_output));
    const tensor y = norm(sum2, p.output_norm, eps, mean, rstd);
    keep_norm(sum2, s.norm_o_in, s.norm_o_mean, s.norm_o_rstd);
    if (inv) s.output = bert::keep(y, kt);
    return y;
  }
  const tensor a_in = norm(x, p.attention_norm, eps, mean, rstd);
  keep_norm(x, s.norm_a_in, s.norm_a_mean, s.norm_a_rstd);
  s.attention.x = bert::keep(a_in, kt);
  bert::attention_forward(branch.data<float>(), s.attention, a_in, mask, p, dims, ctx.rate(cfg.attention_dropout),
                          ctx.stream(id, bert::site::attention_probs), cfg.memory, kt);
  const tensor h = exit_sum(branch, p.attention_out, x, hidden_p, ctx.stream(id, bert::site::attention_output));
  const tensor f_in = norm(h, p.output_norm, eps, mean, rstd);
  keep_norm(h, s.norm_o_in, s.norm_o_mean, s.norm_o_rstd);
  s.feed_forward.x = bert::keep(f_in, kt);
  bert::feed_forward_forward(branch.data<float>(), s.feed_forward, f_in, p, cfg.memory, kt);
  return exit_sum(branch, p.output, h, hidden_p, ctx.stream(id, bert::site::ffn_output));
}

// Sizes past the kernels' parallel thresholds, a hidden size that is not a multiple of the
// vector width or of a Philox block, and layer 1 (its own dropout streams).
bert::bert_config layer_config(layer_norm_placement placement, bool invertible) {
  bert::bert_config cfg = test::small_bert(placement, bert::head_kind::pretraining);
  cfg.hidden_size = 22;
  cfg.num_heads = 2;
  cfg.intermediate_size = 44;
  cfg.hidden_dropout = 0.1f;
  cfg.attention_dropout = 0.1f;
  cfg.memory.normalize_invertible = invertible;
  return cfg;
}

constexpr std::int64_t batch = 120, seq = 13; // 1560 rows of 22: 34320 elements
constexpr std::int64_t layer = 1;

std::vector<float> key_mask() {
  std::vector<float> m(static_cast<std::size_t>(batch * seq), 1.0f);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t t = seq - b % 4; t < seq; ++t) m[static_cast<std::size_t>(b * seq + t)] = 0.0f;
  return m;
}

tensor random_rows(std::int64_t n, std::int64_t c, std::uint32_t seed) {
  const auto values = test::random_vector(n * c, -1.5f, 1.5f, seed);
  tensor x = rows(n, c);
  std::memcpy(x.raw_data(), values.data(), values.size() * sizeof(float));
  return x;
}

} // namespace

TEST_CASE("encoder layer: the fused exits give the output and stash of the separate kernels, bit for bit") {
  const auto mask = key_mask();
  for (auto placement : {layer_norm_placement::post, layer_norm_placement::pre}) {
    for (dtype kt : {dtype::f32, dtype::f16, dtype::bf16}) {
      for (bool invertible : {false, true}) {
        const bert::bert_config cfg = layer_config(placement, invertible);
        bert::bert_parameters params(cfg, bert::bert_range::whole(cfg), kt);
        test::randomize_parameters(params, 5);
        const cpu::bf16_operands_scope operands(kt == dtype::bf16 && cpu::bf16_gemm_supported());
        const std::int64_t H = cfg.hidden_size;
        const tensor x = random_rows(batch * seq, H, 41);
        bert::forward_context ctx;
        ctx.seed = 9;
        ctx.step = 2;
        ctx.stash_type = kt;
        INFO((placement == layer_norm_placement::post ? "post-LN " : "pre-LN ") << dtype_name(kt)
             << (invertible ? " normalize_invertible" : "") << (cpu::bf16_operands() ? " bf16 operands" : ""));

        bert::layer_stash fused, unfused;
        const tensor y = bert::encoder_layer_forward(x.reshape({batch, seq, H}), tensor{}, mask.data(),
                                                     params.layer(layer), cfg, layer, ctx, fused);
        const tensor y_ref = unfused_layer(x, mask.data(), params.layer(layer), cfg, layer, seq, ctx, unfused);
        CHECK(bytes_of(y) == bytes_of(y_ref));
        const std::pair<const char*, std::pair<const tensor*, const tensor*>> stashed[] = {
            {"attention.x", {&fused.attention.x, &unfused.attention.x}},
            {"attention.q", {&fused.attention.q, &unfused.attention.q}},
            {"attention.k", {&fused.attention.k, &unfused.attention.k}},
            {"attention.v", {&fused.attention.v, &unfused.attention.v}},
            {"attention.probs", {&fused.attention.probs, &unfused.attention.probs}},
            {"attention.probs_drop", {&fused.attention.probs_drop, &unfused.attention.probs_drop}},
            {"attention.context", {&fused.attention.context, &unfused.attention.context}},
            {"feed_forward.x", {&fused.feed_forward.x, &unfused.feed_forward.x}},
            {"feed_forward.ff1", {&fused.feed_forward.ff1, &unfused.feed_forward.ff1}},
            {"feed_forward.gelu", {&fused.feed_forward.gelu, &unfused.feed_forward.gelu}},
            {"norm_a_in", {&fused.norm_a_in, &unfused.norm_a_in}},
            {"norm_a_mean", {&fused.norm_a_mean, &unfused.norm_a_mean}},
            {"norm_a_rstd", {&fused.norm_a_rstd, &unfused.norm_a_rstd}},
            {"norm_o_in", {&fused.norm_o_in, &unfused.norm_o_in}},
            {"norm_o_mean", {&fused.norm_o_mean, &unfused.norm_o_mean}},
            {"norm_o_rstd", {&fused.norm_o_rstd, &unfused.norm_o_rstd}},
            {"output", {&fused.output, &unfused.output}},
        };
        for (const auto& [name, pair] : stashed) {
          INFO(name);
          CHECK(pair.first->defined() == pair.second->defined());
          if (pair.first->defined()) {
            CHECK(pair.first->type() == pair.second->type());
            CHECK(bytes_of(*pair.first) == bytes_of(*pair.second));
          }
        }
      }
    }
  }
}

TEST_CASE("attention and feed-forward hand over their output products without the output bias") {
  const bert::bert_config cfg = layer_config(layer_norm_placement::post, false);
  bert::bert_parameters params(cfg, bert::bert_range::whole(cfg));
  test::randomize_parameters(params, 6);
  const std::int64_t N = batch * seq, H = cfg.hidden_size;
  const tensor x = random_rows(N, H, 42);
  const auto mask = key_mask();
  const bert::forward_context ctx;
  auto products = [&] {
    const bert::layer_params p = bert::widen(params.layer(0));
    bert::attention_stash as;
    as.x = x;
    bert::feed_forward_stash fs;
    fs.x = x;
    tensor a = rows(N, H), f = rows(N, H);
    bert::attention_forward(a.data<float>(), as, x, mask.data(), p, {batch, seq, H, cfg.num_heads}, 0.1f,
                            ctx.stream(0, bert::site::attention_probs), cfg.memory, dtype::f32);
    bert::feed_forward_forward(f.data<float>(), fs, x, p, cfg.memory, dtype::f32);
    return std::pair{bytes_of(a), bytes_of(f)};
  };
  const auto with_bias = products();
  for (const tensor* bias : {&params.layer(0).attention_out.bias, &params.layer(0).output.bias})
    std::memset(bias->raw_data(), 0, bias->nbytes());
  CHECK(products() == with_bias);
}

TEST_CASE("attention: a half stash's context is the f32 context rounded (rounded per sequence in the products' "
          "region)") {
  const bert::bert_config cfg = layer_config(layer_norm_placement::post, false);
  bert::bert_parameters params(cfg, bert::bert_range::whole(cfg));
  test::randomize_parameters(params, 7);
  const std::int64_t N = batch * seq, H = cfg.hidden_size;
  const tensor x = random_rows(N, H, 43);
  const auto mask = key_mask();
  const bert::forward_context ctx;
  const cpu::bf16_operands_scope operands(false); // both runs' products read the same f32 values
  const bert::layer_params p = bert::widen(params.layer(0));
  auto context_of = [&](dtype kt) {
    bert::attention_stash as;
    as.x = bert::keep(x, kt);
    tensor out = rows(N, H);
    bert::attention_forward(out.data<float>(), as, x, mask.data(), p, {batch, seq, H, cfg.num_heads}, 0.1f,
                            ctx.stream(0, bert::site::attention_probs), cfg.memory, kt);
    return as.context;
  };
  const tensor f32_context = context_of(dtype::f32);
  REQUIRE(f32_context.type() == dtype::f32);
  for (dtype kt : {dtype::f16, dtype::bf16}) {
    INFO(dtype_name(kt));
    const tensor half_context = context_of(kt);
    REQUIRE(half_context.type() == kt);
    CHECK(bytes_of(half_context) == bytes_of(bert::keep(f32_context, kt)));
  }
}

TEST_CASE("attention with bf16 operands: Q, K and V from one stacked product match three separate products") {
  // Also fails if the column blocks were mixed up (Q from K's weights, a block offset).
  if (!cpu::bf16_gemm_supported()) return dsa::test::skip_for_cpu("AVX512_BF16 or AMX", "no bf16 GEMM");
  for (std::int64_t n_seq : {std::int64_t{1}, std::int64_t{3}, batch}) {
    const bert::bert_config cfg = layer_config(layer_norm_placement::post, false);
    bert::bert_parameters params(cfg, bert::bert_range::whole(cfg), dtype::bf16);
    test::randomize_parameters(params, 8);
    const std::int64_t N = n_seq * seq, H = cfg.hidden_size;
    const tensor x = random_rows(N, H, 44);
    const auto mask = key_mask();
    const bert::forward_context ctx;
    const cpu::bf16_operands_scope operands(true);
    const bert::layer_params p = bert::widen(params.layer(0));
    bert::attention_stash as;
    as.x = bert::keep(x, dtype::bf16);
    tensor out = rows(N, H);
    bert::attention_forward(out.data<float>(), as, x, mask.data(), p, {n_seq, seq, H, cfg.num_heads}, 0.1f,
                            ctx.stream(0, bert::site::attention_probs), cfg.memory, dtype::bf16);
    const std::pair<const bert::linear_params*, const tensor*> parts[] = {
        {&p.query, &as.q}, {&p.key, &as.k}, {&p.value, &as.v}};
    for (const auto& [lp, got] : parts) {
      INFO("sequences " << n_seq);
      tensor product = rows(N, H);
      bert::linear_product(product.data<float>(), bert::operand(as.x), *lp, N);
      cpu::bias_add(product.data<float>(), lp->bias.data<float>(), N, H);
      // At most one bf16 ulp (2^-7 relative) apart: oneDNN may add the same terms in another
      // order for the wider product, and the rounding to bf16 may then land one step away.
      const tensor want = bert::widen(bert::keep(product, dtype::bf16));
      const tensor have = bert::widen(*got);
      REQUIRE(have.numel() == want.numel());
      for (std::int64_t i = 0; i < N * H; ++i) {
        const float a = have.data<float>()[i], b = want.data<float>()[i];
        if (std::fabs(a - b) > std::ldexp(std::fabs(b), -7) + 1e-30f) {
          FAIL_CHECK("element " << i << ": " << a << " against " << b);
          break;
        }
      }
    }
  }
}
