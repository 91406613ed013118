// The device-memory plan's per-micro-batch figures (models/bert/gpu_memory.hpp) against
// the device's pool: what a real forward leaves in its stash (bytes in use after it, less
// before), and the most a forward and a backward hold at once beyond that (the pool's
// high-water mark, reset before each). The plan must not be below what the device took
// (it sizes a budget), nor far above it (it would refuse runs that fit). Both LayerNorm
// placements, both heads, f32 and bf16 storage, the memory flags, activation checkpointing.
#include "gpu_test_util.hpp"

#include "gpu_bert_fixture.hpp"
#include "models/bert/cuda_part.hpp"
#include "models/bert/gpu_memory.hpp"

#include <string>

namespace dsa::test {
namespace {

struct pool_reader {
  cudaMemPool_t pool = nullptr;
  pool_reader() {
    int device = 0;
    DSA_REQUIRE_CUDA(cudaGetDevice(&device));
    DSA_REQUIRE_CUDA(cudaDeviceGetDefaultMemPool(&pool, device));
  }
  std::int64_t used() const { return attribute(cudaMemPoolAttrUsedMemCurrent); }
  std::int64_t high() const { return attribute(cudaMemPoolAttrUsedMemHigh); }
  void reset_high() const {
    std::uint64_t zero = 0; // resets the high-water mark to what is in use now
    DSA_REQUIRE_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  }
  std::int64_t attribute(cudaMemPoolAttr a) const {
    std::uint64_t v = 0;
    DSA_REQUIRE_CUDA(cudaMemPoolGetAttribute(pool, a, &v));
    return static_cast<std::int64_t>(v);
  }
};

} // namespace

TEST_CASE("device-memory plan: a part's stash and scratch bound what the device's pool holds") {
  for (const bert::head_kind head : {bert::head_kind::pretraining, bert::head_kind::squad})
    for (const bert::layer_norm_placement norm : {bert::layer_norm_placement::post, bert::layer_norm_placement::pre})
      for (const cuda::elem type : {cuda::elem::f32, cuda::elem::bf16})
        for (int variant = 0; variant < 3; ++variant) { // plain, the three memory flags, checkpointing
          bert::bert_config cfg = gpu_bert_config(2);
          cfg.head = head;
          cfg.norm = norm;
          if (variant == 1) cfg.memory = bert::memory_flags{true, true, true};
          cfg.checkpoint_activations = variant == 2;
          INFO((head == bert::head_kind::squad ? "squad" : "pretraining")
               << (norm == bert::layer_norm_placement::pre ? ", pre-LN" : ", post-LN") << ", storage "
               << std::string(elem_name(type)) << ", variant " << variant);
          const bert::bert_batch batch = small_batch(cfg);
          bert::gpu_micro_batch mb;
          mb.batch = batch.batch_size();
          mb.seq = batch.seq_length();
          mb.predictions = batch.masked_lm_positions.defined() ? batch.masked_lm_positions.dim(1) : 0;
          mb.elem_size = static_cast<std::int64_t>(cuda::elem_size(type));
          const bert::bert_range whole = bert::bert_range::whole(cfg);
          const std::int64_t stash_planned = bert::gpu_part_stash_bytes(cfg, whole, mb);
          const std::int64_t scratch_planned = bert::gpu_part_scratch_bytes(cfg, whole, mb);

          bert::bert_parameters host(cfg, whole);
          prepare_gpu_bert(host);
          test_stream stream;
          bert::gpu::part gpu(host, type, stream.get());
          bert::forward_context ctx;
          ctx.seed = 5;
          bert::gpu::part_stash stash;
          const pool_reader pool;
          stream.sync();
          const std::int64_t before = pool.used();
          pool.reset_high();
          (void)gpu.forward(bert::gpu::device_array(), batch, ctx, 1.0f, stash);
          stream.sync();
          const std::int64_t stash_measured = pool.used() - before;
          const std::int64_t forward_peak = pool.high() - before;
          pool.reset_high();
          (void)gpu.backward(nullptr, stash);
          stream.sync();
          const std::int64_t backward_peak = pool.high() - before;
          INFO("stash planned " << stash_planned << ", measured " << stash_measured << "; scratch planned "
                                << scratch_planned << ", forward peak " << forward_peak << ", backward peak "
                                << backward_peak);
          CHECK(stash_measured <= stash_planned);
          CHECK(stash_measured >= stash_planned * 8 / 10);
          CHECK(forward_peak <= stash_planned + scratch_planned);
          CHECK(backward_peak <= stash_planned + scratch_planned);
        }
}

} // namespace dsa::test
