// The GPU part (models/bert/cuda_part.hpp) as pipeline stages run it: a three-layer BERT
// cut into three ranges (embeddings + layer 0, layer 1, layer 2 + the pre-training head),
// chained on the device, against the same three ranges of the CPU model (bert_part) on the
// same batch, dropout on with the same streams: the losses and every gradient of every
// range (the tied word embedding's two copies each against its CPU range), in f32, bf16
// and f16 storage (f16 with a loss scale of 1024 on both sides, as fp16 training runs it);
// post-LN and pre-LN (whose last range has the final LayerNorm), and with the three memory
// flags and activation checkpointing on both sides. And a version uploaded part by part on
// the part's upload stream (upload_version) against the same values loaded in order; and
// a part without resident parameters whose gate (ZeRO-3's zero3_binding) binds each part's
// weights and gradients as it runs, against the resident part, bit for bit.
#include "gpu_test_util.hpp"

#include "actors/train/stage/zero3_binding.hpp"

#include "kernels/cpu/convert.hpp"
#include "models/bert/bert_part.hpp"
#include "models/bert/cuda_part.hpp"
#include "gpu_bert_fixture.hpp"

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>

namespace dsa::test {
namespace {

std::vector<bert::bert_range> three_ranges() {
  return {bert::bert_range::layers(0, 1).with_embeddings(), bert::bert_range::layers(1, 2),
          bert::bert_range::layers(2, 3).with_head()};
}

bert::gpu::device_array copy_of(const void* src, std::size_t bytes, cudaStream_t stream) {
  bert::gpu::device_array d(bytes, stream);
  REQUIRE(cudaMemcpyAsync(d.get(), src, bytes, cudaMemcpyDeviceToDevice, stream) == cudaSuccess);
  return d;
}

// savers: the three memory flags and activation checkpointing, on both sides.
void ranges_against_cpu(bert::layer_norm_placement placement, bool savers = false) {
  bert::bert_config cfg = gpu_bert_config(3);
  cfg.norm = placement; // pre-LN: the last range adds the final LayerNorm before the head
  cfg.memory.normalize_invertible = cfg.memory.gelu_checkpoint = cfg.memory.attn_dropout_checkpoint = savers;
  cfg.checkpoint_activations = savers;
  const bert::bert_batch batch = small_batch(cfg);
  bert::forward_context ctx;
  ctx.seed = 9;
  ctx.step = 4;
  ctx.micro_batch = 1;
  for (const cuda::elem type : {cuda::elem::f32, cuda::elem::bf16, cuda::elem::f16}) {
    INFO("storage " << std::string(elem_name(type)));
    const float scale = type == cuda::elem::f16 ? 1024.0f : 1.0f;
    // The CPU chain.
    std::vector<std::unique_ptr<bert::bert_part>> cpu;
    for (const auto& r : three_ranges()) {
      cpu.push_back(std::make_unique<bert::bert_part>(cfg, r));
      prepare_gpu_bert(cpu.back()->parameters());
    }
    std::vector<bert::part_stash> cpu_stash(3);
    tensor hidden;
    bert::bert_losses ref;
    for (std::size_t i = 0; i < 3; ++i) {
      auto out = cpu[i]->forward(hidden, batch, ctx, cpu_stash[i]);
      REQUIRE(out);
      hidden = out->hidden;
      ref = out->losses;
    }
    bert::backward_options options;
    options.loss_scale = scale;
    tensor grad;
    for (std::size_t i = 3; i-- > 0;)
      grad = cpu[i]->backward(grad, cpu_stash[i], options);
    REQUIRE(ref.mlm_count > 0);

    // The GPU chain, activations handed from stash to stash on the device.
    test_stream stream;
    std::vector<std::unique_ptr<bert::bert_parameters>> host;
    std::vector<std::unique_ptr<bert::gpu::part>> gpu;
    for (const auto& r : three_ranges()) {
      host.push_back(std::make_unique<bert::bert_parameters>(cfg, r));
      prepare_gpu_bert(*host.back());
      gpu.push_back(std::make_unique<bert::gpu::part>(*host.back(), type, stream.get()));
      CHECK(gpu.back()->parameter_count() == host.back()->count());
    }
    const auto bytes = static_cast<std::size_t>(batch.batch_size() * batch.seq_length() * cfg.hidden_size *
                                                cuda::elem_size(type));
    std::vector<bert::gpu::part_stash> stash(3);
    const void* out = nullptr;
    for (std::size_t i = 0; i < 3; ++i)
      out = gpu[i]->forward(i == 0 ? bert::gpu::device_array() : copy_of(out, bytes, stream.get()), batch, ctx,
                            scale, stash[i]);
    CHECK(out == nullptr); // the head's range has no output
    const bert::bert_losses got = gpu[2]->losses(stash[2]);
    bert::gpu::device_array dy;
    for (std::size_t i = 3; i-- > 0;)
      dy = gpu[i]->backward(dy.get(), stash[i]);
    CHECK(dy.get() == nullptr); // the embeddings' range has no input gradient

    const test::tolerance& limit = type == cuda::elem::f32 ? test::gpu_f32_vs_cpu : test::gpu_half_vs_cpu;
    CHECK(got.mlm_count == ref.mlm_count);
    CHECK(got.nsp_count == ref.nsp_count);
    CHECK(std::fabs(got.mlm_loss - ref.mlm_loss) <= limit.rel * std::fabs(ref.mlm_loss));
    CHECK(std::fabs(got.nsp_loss - ref.nsp_loss) <= limit.rel * std::fabs(ref.nsp_loss) + limit.abs);
    for (std::size_t i = 0; i < 3; ++i) {
      std::vector<tensor> grads;
      for (const auto& e : host[i]->entries())
        grads.push_back(e.grad);
      gpu[i]->download_gradients(grads);
      for (const auto& e : host[i]->entries()) {
        const double err = gradient_error(*host[i], cpu[i]->parameters(), e.spec.name);
        INFO("range " << host[i]->range().to_string() << ", " << e.spec.name << ": relative error " << err);
        CHECK(std::isfinite(err));
        CHECK(err <= limit.rel);
      }
    }
  }
}

} // namespace

TEST_CASE("cuda part: three pipeline ranges equal the CPU ranges, losses and every gradient (post-LN)") {
  ranges_against_cpu(bert::layer_norm_placement::post);
}

TEST_CASE("cuda part: three pipeline ranges equal the CPU ranges, losses and every gradient (pre-LN)") {
  ranges_against_cpu(bert::layer_norm_placement::pre);
}

TEST_CASE("cuda part: with the memory flags and activation checkpointing on both sides, the ranges equal the CPU's") {
  ranges_against_cpu(bert::layer_norm_placement::post, true);
  ranges_against_cpu(bert::layer_norm_placement::pre, true);
}

TEST_CASE("cuda part: values loaded from half tensors, and a middle range without its input refused") {
  const bert::bert_config cfg = gpu_bert_config(3);
  bert::bert_parameters params(cfg, bert::bert_range::layers(1, 2));
  prepare_gpu_bert(params);
  test_stream stream;
  bert::gpu::part gpu(params, cuda::elem::bf16, stream.get());
  // A bf16 version of entry 0 loads and reads back as its f32 widening.
  const auto& e = params.entries()[0];
  tensor half = tensor::empty(e.spec.shape, dtype::bf16);
  cpu::cast(half.raw_data(), dtype::bf16, e.value.raw_data(), dtype::f32, e.value.numel());
  gpu.load_value(0, half);
  std::vector<tensor> values;
  for (const auto& x : params.entries())
    values.push_back(tensor::empty(x.spec.shape, dtype::f32));
  gpu.download_values(values);
  tensor widened = tensor::empty(e.spec.shape, dtype::f32);
  cpu::cast(widened.raw_data(), dtype::f32, half.raw_data(), dtype::bf16, e.value.numel());
  CHECK(std::memcmp(widened.raw_data(), values[0].raw_data(), static_cast<std::size_t>(e.value.numel()) * 4) == 0);
  CHECK_THROWS_WITH(gpu.load_value(0, tensor::empty({3}, dtype::f32)), doctest::Contains("expected"));
  // A middle range without the previous stage's output.
  bert::gpu::part_stash stash;
  CHECK_THROWS_WITH(gpu.forward(bert::gpu::device_array(), small_batch(cfg), bert::forward_context{}, 1.0f, stash),
                    doctest::Contains("previous stage"));
}

// The whole three-layer model's parameters, prepared as the other GPU tests' are.
bert::bert_parameters whole_parameters(const bert::bert_config& cfg) {
  bert::bert_parameters params(cfg, bert::bert_range::layers(0, 3).with_embeddings().with_head());
  prepare_gpu_bert(params);
  return params;
}

TEST_CASE("cuda part: a version uploaded part by part gives the losses of the same values loaded in order") {
  const bert::bert_config cfg = gpu_bert_config(3);
  const bert::bert_parameters params = whole_parameters(cfg);
  test_stream stream;
  // Two copies of the part on one stream, no masters (a CUDA stage's), bf16 working copies.
  bert::gpu::part loaded(params, cuda::elem::bf16, stream.get(), false, false);
  bert::gpu::part uploaded(params, cuda::elem::bf16, stream.get(), false, false);
  const bert::bert_batch batch = small_batch(cfg);
  bert::forward_context ctx;
  ctx.seed = 3;
  auto loss_of = [&](bert::gpu::part& p) {
    bert::gpu::part_stash st;
    p.forward(bert::gpu::device_array(), batch, ctx, 1.0f, st);
    return p.losses(st);
  };
  const bert::bert_losses before = loss_of(uploaded);
  // The next version: every value scaled, in bf16 as a shard publishes it, in pinned memory
  // as a CUDA stage keeps it (so the copies are truly asynchronous).
  std::size_t bytes = 0;
  for (const auto& e : params.entries()) bytes += static_cast<std::size_t>(e.value.numel()) * 2;
  auto block = std::make_shared<bert::gpu::pinned_buffer>();
  block->reserve(bytes, "the test's version");
  REQUIRE(block->pinned());
  std::vector<tensor> version;
  std::size_t at = 0;
  for (const auto& e : params.entries()) {
    const auto n = static_cast<std::size_t>(e.value.numel()) * 2;
    tensor v = tensor::from_storage(
        storage::wrap(static_cast<char*>(block->get()) + at, n, device::cpu(), [block](void*) {}), 0, e.spec.shape,
        dtype::bf16);
    at += n;
    std::vector<float> scaled(static_cast<std::size_t>(e.value.numel()));
    for (std::size_t k = 0; k < scaled.size(); ++k) scaled[k] = 0.9f * e.value.data<float>()[k];
    cpu::cast(v.raw_data(), dtype::bf16, scaled.data(), dtype::f32, e.value.numel());
    version.push_back(v);
  }
  for (std::size_t i = 0; i < version.size(); ++i) loaded.load_value(i, version[i]);
  // A forward of the old version enqueued first, then the upload: it must not see the new
  // weights, and the forward after the upload must see all of them.
  bert::gpu::part_stash old_stash;
  uploaded.forward(bert::gpu::device_array(), batch, ctx, 1.0f, old_stash);
  uploaded.upload_version(version);
  const bert::bert_losses old_again = uploaded.losses(old_stash);
  CHECK(old_again.total == before.total);
  const bert::bert_losses want = loss_of(loaded), got = loss_of(uploaded);
  CHECK(got.total == want.total);
  CHECK(got.mlm_loss == want.mlm_loss);
  CHECK(got.nsp_loss == want.nsp_loss);
  CHECK(got.total != before.total);
  uploaded.wait_upload_read();
  CHECK_THROWS_WITH(uploaded.upload_version({}), doctest::Contains("a version of 0 tensors"));
}

namespace {

// ZeRO-3's bindings without a fetcher for the values: every value of the part entered is
// bound from the host copy and unbound as it leaves; each final gradient downloaded (a
// stream wait) and summed on the host.
struct whole_binder final : train::zero3_binder {
  bert::gpu::part& part;
  const bert::bert_parameters& params;
  std::map<std::int64_t, std::vector<std::size_t>> reads; // part id -> the tensors it reads
  std::vector<std::vector<float>> grads;
  std::size_t handed = 0;
  whole_binder(bert::gpu::part& p, const bert::bert_parameters& ps) : part(p), params(ps) {
    for (const auto& fp : train::zero3_parts(ps)) reads[fp.id] = fp.tensors;
    for (const auto& e : ps.entries()) grads.emplace_back(static_cast<std::size_t>(e.value.numel()), 0.0f);
  }
  void bind_values(std::vector<std::pair<std::size_t, tensor>>) override {}
  void unbind_values(const std::vector<std::size_t>&) override {}
  void bind_gradients(const std::vector<std::size_t>& indices) override {
    for (std::size_t i : indices) part.bind_gradient(i);
  }
  void hand_over(const std::vector<std::size_t>& indices, std::uint32_t) override {
    for (std::size_t i : indices) {
      std::vector<float> host(grads[i].size());
      REQUIRE(cudaMemcpyAsync(host.data(), part.gradient_data(i), host.size() * 4, cudaMemcpyDeviceToHost,
                              part.stream()) == cudaSuccess);
      REQUIRE(cudaStreamSynchronize(part.stream()) == cudaSuccess);
      for (std::size_t k = 0; k < host.size(); ++k) grads[i][k] += host[k];
      part.unbind_gradient(i);
      ++handed;
    }
  }
};

// The gate: the binding (gradients) with each part's values bound on entry, freed on leaving.
struct value_gate final : bert::part_gate {
  train::zero3_binding& binding;
  whole_binder& binder;
  void enter(std::int64_t id) override {
    for (std::size_t i : binder.reads.at(id)) binder.part.bind_value(i, binder.params.entries()[i].value);
    binding.enter(id);
  }
  void leave(std::int64_t id) override {
    binding.leave(id);
    for (std::size_t i : binder.reads.at(id)) binder.part.unbind_value(i);
  }
  value_gate(train::zero3_binding& b, whole_binder& w) : binding(b), binder(w) {}
};

} // namespace

TEST_CASE("cuda part: weights and gradients bound part by part (ZeRO-3) give the resident part's bits") {
  const bert::bert_config cfg = gpu_bert_config(3);
  const bert::bert_parameters params = whole_parameters(cfg);
  test_stream stream;
  // Deterministic sums: the same bits whatever the allocation addresses.
  bert::gpu::part resident(params, cuda::elem::bf16, stream.get(), true, false);
  bert::gpu::part gated(params, cuda::elem::bf16, stream.get(), true, false, /*resident=*/false);
  whole_binder binder(gated, params);
  train::zero3_binding binding(train::zero3_parts(params), params.entries().size(), nullptr, binder);
  value_gate gate(binding, binder);
  gated.set_gate(&gate);
  CHECK_THROWS_WITH(resident.set_gate(&gate), doctest::Contains("resident"));
  const bert::bert_batch batch = small_batch(cfg);
  bert::forward_context ctx;
  ctx.seed = 5;
  // Each micro-batch's gradients downloaded and summed on the host on both sides (ZeRO-3's
  // partition sums them so), in the same order.
  std::vector<std::vector<float>> want;
  for (const auto& e : params.entries()) want.emplace_back(static_cast<std::size_t>(e.value.numel()), 0.0f);
  double want_loss = 0, got_loss = 0;
  for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
    ctx.micro_batch = static_cast<std::uint32_t>(micro_batch);
    bert::gpu::part_stash a, b;
    resident.zero_gradients();
    resident.forward(bert::gpu::device_array(), batch, ctx, 1.0f, a);
    want_loss += resident.losses(a).total;
    resident.backward(nullptr, a);
    std::vector<tensor> one;
    for (const auto& e : params.entries()) one.push_back(tensor::zeros(e.spec.shape, dtype::f32));
    resident.download_gradients(one);
    for (std::size_t i = 0; i < one.size(); ++i)
      for (std::size_t k = 0; k < want[i].size(); ++k) want[i][k] += one[i].data<float>()[k];
    binding.begin(0, false);
    gated.forward(bert::gpu::device_array(), batch, ctx, 1.0f, b);
    got_loss += gated.losses(b).total;
    binding.begin(0, true);
    gated.backward(nullptr, b);
  }
  CHECK(got_loss == want_loss);
  CHECK(binder.handed == 2 * params.entries().size());
  CHECK(binding.gradients_bound() == 0);
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("parameter " << params.entries()[i].spec.name);
    CHECK(std::memcmp(want[i].data(), binder.grads[i].data(), want[i].size() * 4) == 0);
  }
  // Without a gate nothing would be bound: refused before anything is enqueued.
  gated.set_gate(nullptr);
  bert::gpu::part_stash c;
  CHECK_THROWS_WITH(gated.forward(bert::gpu::device_array(), batch, ctx, 1.0f, c), doctest::Contains("needs a gate"));
}

} // namespace dsa::test
