// The deterministic mode (devices.deterministic) of the GPU part: two fresh parts with the
// same values, batch and dropout streams give the same bits in every gradient (ordered sums
// instead of float atomics, no split-K products), over both LayerNorm placements and both
// heads, f32 and bf16, on a batch of 1024 rows; and the mode's gradients are the default
// mode's up to summation order (and, in bf16 post-LN, the rounding of the exit bias
// gradients' terms).
#include "gpu_test_util.hpp"

#include "models/bert/cuda_part.hpp"
#include "gpu_bert_fixture.hpp"

#include <cstring>
#include <string>

namespace dsa::test {
namespace {

// 64 sequences of 16 tokens over the fixture's 50-word vocabulary: 1024 rows, so the default
// mode's atomics come from many blocks and the same word rows are hit many times.
bert::bert_batch wide_batch() {
  constexpr std::int64_t B = 64, T = 16, P = 3;
  bert::bert_batch b;
  b.input_ids = tensor::empty({B, T}, dtype::i32);
  b.token_type_ids = tensor::empty({B, T}, dtype::i32);
  b.attention_mask = tensor::empty({B, T}, dtype::f32);
  b.masked_lm_positions = tensor::empty({B, P}, dtype::i32);
  b.masked_lm_ids = tensor::empty({B, P}, dtype::i32);
  b.next_sentence_labels = tensor::empty({B}, dtype::i32);
  b.start_positions = tensor::empty({B}, dtype::i32);
  b.end_positions = tensor::empty({B}, dtype::i32);
  std::uint32_t x = 12345;
  auto next = [&] { return x = x * 1664525u + 1013904223u; };
  for (std::int64_t s = 0; s < B; ++s) {
    for (std::int64_t t = 0; t < T; ++t) {
      b.input_ids.data<std::int32_t>()[s * T + t] = static_cast<std::int32_t>(next() >> 8) % 49 + 1;
      b.token_type_ids.data<std::int32_t>()[s * T + t] = t < T / 2 ? 0 : 1;
      b.attention_mask.data<float>()[s * T + t] = t < T - static_cast<std::int64_t>(s % 3) ? 1.0f : 0.0f;
    }
    for (std::int64_t j = 0; j < P; ++j) {
      b.masked_lm_positions.data<std::int32_t>()[s * P + j] = static_cast<std::int32_t>(1 + 4 * j);
      b.masked_lm_ids.data<std::int32_t>()[s * P + j] = static_cast<std::int32_t>(next() >> 8) % 49 + 1;
    }
    b.next_sentence_labels.data<std::int32_t>()[s] = static_cast<std::int32_t>(s % 2);
    b.start_positions.data<std::int32_t>()[s] = static_cast<std::int32_t>(s % 8);
    b.end_positions.data<std::int32_t>()[s] = static_cast<std::int32_t>(8 + s % 8);
  }
  return b;
}

// One forward and backward of two micro-batches on a fresh whole-model part; its gradients.
std::vector<tensor> gradients_of(const bert::bert_config& cfg, cuda::elem type, bool deterministic,
                                 std::unique_ptr<bert::bert_parameters>& host) {
  host = std::make_unique<bert::bert_parameters>(cfg, bert::bert_range::whole(cfg));
  prepare_gpu_bert(*host);
  test_stream stream;
  bert::gpu::part gpu(*host, type, stream.get(), deterministic);
  bert::bert_batch batch = wide_batch();
  batch.input_ids.data<std::int32_t>()[3] = 0; // a pad token: its word row gets no gradient
  bert::gpu::part_stash stash;
  bert::forward_context ctx;
  ctx.seed = 17;
  for (std::uint32_t micro = 0; micro < 2; ++micro) {
    ctx.micro_batch = micro;
    (void)gpu.forward(bert::gpu::device_array(), batch, ctx, 0.5f, stash);
    (void)gpu.backward(nullptr, stash);
  }
  std::vector<tensor> grads;
  for (const auto& e : host->entries())
    grads.push_back(e.grad);
  gpu.download_gradients(grads);
  return grads;
}

} // namespace

TEST_CASE("cuda part: the deterministic mode repeats every gradient bit for bit") {
  for (const bert::layer_norm_placement placement : {bert::layer_norm_placement::post, bert::layer_norm_placement::pre}) {
    for (const bert::head_kind head : {bert::head_kind::pretraining, bert::head_kind::squad}) {
      for (const cuda::elem type : {cuda::elem::f32, cuda::elem::bf16}) {
        INFO((placement == bert::layer_norm_placement::pre ? "pre-LN" : "post-LN")
             << ", " << (head == bert::head_kind::squad ? "squad" : "pretraining") << ", "
             << std::string(elem_name(type)));
        bert::bert_config cfg = gpu_bert_config(2);
        cfg.norm = placement;
        cfg.head = head;
        std::unique_ptr<bert::bert_parameters> a, b, plain;
        const auto first = gradients_of(cfg, type, true, a);
        const auto second = gradients_of(cfg, type, true, b);
        (void)gradients_of(cfg, type, false, plain);
        for (std::size_t i = 0; i < first.size(); ++i) {
          const std::string& name = a->entries()[i].spec.name;
          INFO(name);
          CHECK(std::memcmp(first[i].raw_data(), second[i].raw_data(), static_cast<std::size_t>(first[i].numel()) * 4) ==
                0);
          // Against the default mode: the same terms summed in another order, except that in
          // half storage post-LN's exit bias gradients sum the rounded branch gradients (as
          // the weight gradients' products read them) where the fused kernel sums f32 ones.
          const double err = gradient_error(*a, *plain, name);
          INFO("relative error " << err);
          const bool rounded_terms = type != cuda::elem::f32 && placement == bert::layer_norm_placement::post;
          CHECK(err <= (rounded_terms ? test::gpu_half_vs_cpu.rel : test::gpu_f32_reduction.rel));
        }
      }
    }
  }
}

} // namespace dsa::test
