// The deterministic mode (devices.deterministic) of the GPU part: two fresh parts with the
// same values, batch and dropout streams give the same bits in every gradient (ordered sums
// instead of float atomics, no split-K products), over both LayerNorm placements and both
// heads, f32 and bf16; and the mode's gradients are the default mode's up to summation order
// (and, in bf16 post-LN, the rounding of the exit bias gradients' terms).
#include "gpu_test_util.hpp"

#include "models/bert/cuda_part.hpp"
#include "gpu_bert_fixture.hpp"

#include <cstring>
#include <string>

namespace dsa::test {
namespace {

// One forward and backward of two micro-batches on a fresh whole-model part; its gradients.
std::vector<tensor> gradients_of(const bert::bert_config& cfg, cuda::elem type, bool deterministic,
                                 std::unique_ptr<bert::bert_parameters>& host) {
  host = std::make_unique<bert::bert_parameters>(cfg, bert::bert_range::whole(cfg));
  prepare_gpu_bert(*host);
  test_stream stream;
  bert::gpu::part gpu(*host, type, stream.get(), deterministic);
  bert::bert_batch batch = small_batch(cfg);
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
