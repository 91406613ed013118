// The zero-bubble B/W split on the CPU (models/bert/weight_grads.hpp): a backward with its
// weight-gradient products deferred, then those products run, gives every gradient and the
// input gradient of the plain backward bit for bit, over two micro-batches whose W run after
// both B (W in micro-batch order, as 1F1B accumulates); both LayerNorm placements, both heads,
// f32 and bf16 stashes, a whole model and a middle range; and B leaves the weights' gradients
// untouched until W runs.
#include "kernels/cpu/gemm_bf16.hpp"
#include "models/bert/weight_grads.hpp"
#include "tests/models/bert_fixture.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace dsa;

bool same_bits(const tensor& a, const tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.raw_data(), b.raw_data(), static_cast<std::size_t>(a.numel()) * dtype_size(a.type())) == 0;
}

double abs_sum(const tensor& t) {
  double s = 0.0;
  for (std::int64_t i = 0; i < t.numel(); ++i) s += std::fabs(static_cast<double>(t.data<float>()[i]));
  return s;
}

// Two micro-batches' forward and backward through `range`; deferred: each backward's
// weight-gradient products into its own list, both run after the second backward. Returns
// the input gradients (undefined with the embeddings).
std::vector<tensor> two_micro_batches(bert::bert_part& part, bool deferred, dtype stash_type,
                                      const tensor& hidden_in) {
  const bert::bert_batch batch = test::small_batch(part.parameters().config());
  std::vector<tensor> dins;
  bert::deferred_weight_grads lists[2];
  for (std::uint32_t micro = 0; micro < 2; ++micro) {
    bert::forward_context ctx;
    ctx.seed = 3;
    ctx.micro_batch = micro;
    ctx.stash_type = stash_type;
    bert::part_stash stash;
    auto out = part.forward(hidden_in, batch, ctx, stash);
    REQUIRE(out);
    tensor dy;
    if (!part.range().has_head()) {
      dy = tensor::empty(out->hidden.shape(), dtype::f32);
      for (std::int64_t i = 0; i < dy.numel(); ++i) dy.data<float>()[i] = 0.01f * static_cast<float>((i * 7) % 13 - 6);
    }
    bert::backward_options options;
    options.loss_scale = 0.5f;
    if (deferred) {
      bert::defer_weight_grads defer(lists[micro]);
      dins.push_back(part.backward(dy, stash, options));
    } else {
      dins.push_back(part.backward(dy, stash, options));
    }
  }
  if (deferred) {
    CHECK(!lists[0].empty());
    CHECK(lists[0].bytes() > 0);
    // Before W the weights' gradients are untouched; so are the linear biases' with f32
    // operands (they move to W with dy's copy), not the intermediate's (fused with GELU).
    const auto& p = part.parameters();
    const bert::bert_range& r = part.range();
    if (r.first_layer < r.last_layer) {
      CHECK(abs_sum(p.layer(r.first_layer).query.dweight) == 0.0);
      CHECK(abs_sum(p.layer(r.first_layer).intermediate.dbias) > 0.0);
      if (!cpu::bf16_operands()) CHECK(abs_sum(p.layer(r.first_layer).query.dbias) == 0.0);
      else CHECK(abs_sum(p.layer(r.first_layer).query.dbias) > 0.0);
    }
    lists[0].run();
    lists[1].run();
    CHECK(lists[0].empty());
  }
  return dins;
}

} // namespace

TEST_CASE("deferred weight gradients (B then W) equal the plain backward bit for bit") {
  for (const auto norm : {bert::layer_norm_placement::post, bert::layer_norm_placement::pre})
    for (const auto head : {bert::head_kind::pretraining, bert::head_kind::squad})
      for (const dtype stash : {dtype::f32, dtype::bf16})
        for (const bool middle : {false, true}) {
          CAPTURE(static_cast<int>(norm));
          CAPTURE(static_cast<int>(head));
          CAPTURE(dtype_name(stash));
          CAPTURE(middle);
          bert::bert_config cfg = test::small_bert(norm, head);
          cfg.hidden_dropout = cfg.attention_dropout = 0.1f;
          const bert::bert_range range =
              middle ? bert::bert_range::layers(1, 2) : bert::bert_range::whole(cfg);
          tensor hidden;
          if (middle) {
            hidden = tensor::empty({2, 7, cfg.hidden_size}, dtype::f32);
            for (std::int64_t i = 0; i < hidden.numel(); ++i)
              hidden.data<float>()[i] = 0.1f * static_cast<float>((i * 5) % 11 - 5);
          }
          bert::bert_part plain(cfg, range), split(cfg, range);
          test::randomize_parameters(plain.parameters(), 4);
          test::randomize_parameters(split.parameters(), 4);
          const auto a = two_micro_batches(plain, false, stash, hidden);
          const auto b = two_micro_batches(split, true, stash, hidden);
          for (std::size_t i = 0; i < a.size(); ++i) {
            CHECK(a[i].defined() == b[i].defined());
            if (a[i].defined()) CHECK(same_bits(a[i], b[i]));
          }
          const auto& pa = plain.parameters().entries();
          const auto& pb = split.parameters().entries();
          REQUIRE(pa.size() == pb.size());
          for (std::size_t i = 0; i < pa.size(); ++i) {
            INFO(pa[i].spec.name);
            CHECK(same_bits(pa[i].grad, pb[i].grad));
          }
        }
}

TEST_CASE("weight-gradient deferrals do not nest, and end with their scope") {
  bert::deferred_weight_grads a, b;
  {
    bert::defer_weight_grads outer(a);
    CHECK(bert::weight_grad_deferral() == &a);
  }
  CHECK(bert::weight_grad_deferral() == nullptr);
  bert::defer_weight_grads again(b);
  CHECK(bert::weight_grad_deferral() == &b);
}
