// The GPU encoder layer (models/bert/cuda_layer.hpp) against the CPU layer
// (encoder_layer_forward / encoder_layer_backward), post-LN and pre-LN, dropout on in attention and on
// both exits with the same streams: the output, the input gradient and every parameter
// gradient, in f32 storage (close to the CPU's f32) and in bf16 (within bf16's error).
#include "gpu_test_util.hpp"

#include "models/bert/bert_parameters.hpp"
#include "models/bert/cuda_layer.hpp"
#include "models/bert/encoder_layer.hpp"
#include "gpu_bert_fixture.hpp"
#include "tests/support/random.hpp"

#include <cmath>
#include <cstring>
#include <deque>
#include <string>

namespace dsa::test {
namespace {

constexpr std::int64_t batch = 3, seq = 19, layer = 1;

std::vector<float> values_of(const tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  std::memcpy(v.data(), t.raw_data(), v.size() * 4);
  return v;
}

// ||a - b|| and ||a|| (2-norms, in double).
double distance(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    sum += d * d;
  }
  return std::sqrt(sum);
}
double norm(const std::vector<float>& a) {
  return std::max(distance(a, std::vector<float>(a.size(), 0.0f)), 1e-30);
}

// Device copies for one run; each buffer lives as long as the run.
struct uploads {
  std::deque<device_buffer> buffers;
  void* add(const std::vector<std::uint8_t>& bytes) {
    buffers.emplace_back(bytes.size());
    upload(buffers.back(), bytes);
    return buffers.back().as<void>();
  }
  float* zeros(std::size_t n) {
    return static_cast<float*>(add(std::vector<std::uint8_t>(n * 4, 0)));
  }
};

void layer_against_cpu(bert::layer_norm_placement placement) {
  bert::bert_config cfg = gpu_bert_config();
  cfg.norm = placement;
  bert::bert_parameters params(cfg, bert::bert_range::whole(cfg));
  randomize_parameters(params, 5);
  const bert::layer_params& lp = params.layer(layer);
  // Smaller weights than the fixture's, so attention is not saturated and bf16 has room.
  for (const tensor* w : {&lp.query.weight, &lp.key.weight, &lp.value.weight, &lp.attention_out.weight,
                          &lp.intermediate.weight, &lp.output.weight}) {
    auto* p = static_cast<float*>(w->raw_data());
    for (std::int64_t i = 0; i < w->numel(); ++i)
      p[i] *= 0.25f;
  }
  const std::int64_t N = batch * seq, H = cfg.hidden_size, I = cfg.intermediate_size;
  const auto x_values = random_vector(N * H, -1.0f, 1.0f, 41);
  const auto dy_values = random_vector(N * H, -1.0f, 1.0f, 42);
  std::vector<float> mask(static_cast<std::size_t>(N), 1.0f);
  for (std::int64_t t = seq - 5; t < seq; ++t)
    mask[static_cast<std::size_t>(seq + t)] = 0.0f; // the second sequence is padded
  bert::forward_context ctx;
  ctx.seed = 9;
  ctx.step = 2;
  ctx.micro_batch = 1;

  // The CPU layer in f32.
  params.zero_grad();
  tensor x = tensor::empty({batch, seq, H}, dtype::f32), dy = tensor::empty({batch, seq, H}, dtype::f32);
  std::memcpy(x.raw_data(), x_values.data(), x_values.size() * 4);
  std::memcpy(dy.raw_data(), dy_values.data(), dy_values.size() * 4);
  bert::layer_stash cpu_stash;
  const tensor y_ref = bert::encoder_layer_forward(x, tensor{}, mask.data(), lp, cfg, layer, ctx, cpu_stash);
  const tensor dx_ref = bert::encoder_layer_backward(dy, cpu_stash, lp, cfg);

  for (const cuda::elem type : {cuda::elem::f32, cuda::elem::bf16}) {
    INFO("storage " << std::string(elem_name(type)));
    uploads up;
    auto matrix = [&](const tensor& t) { return up.add(encode(values_of(t), type)); };
    auto vec = [&](const tensor& t) { return static_cast<const float*>(up.add(encode(values_of(t), cuda::elem::f32))); };
    bert::gpu::layer_weights w;
    w.query = matrix(lp.query.weight);
    w.key = matrix(lp.key.weight);
    w.value = matrix(lp.value.weight);
    w.attention_out = matrix(lp.attention_out.weight);
    w.intermediate = matrix(lp.intermediate.weight);
    w.output = matrix(lp.output.weight);
    w.query_bias = vec(lp.query.bias);
    w.key_bias = vec(lp.key.bias);
    w.value_bias = vec(lp.value.bias);
    w.attention_out_bias = vec(lp.attention_out.bias);
    w.intermediate_bias = vec(lp.intermediate.bias);
    w.output_bias = vec(lp.output.bias);
    w.attention_norm_gamma = vec(lp.attention_norm.weight);
    w.attention_norm_beta = vec(lp.attention_norm.bias);
    w.output_norm_gamma = vec(lp.output_norm.weight);
    w.output_norm_beta = vec(lp.output_norm.bias);
    const auto HH = static_cast<std::size_t>(H * H), IH = static_cast<std::size_t>(I * H),
               Hs = static_cast<std::size_t>(H), Is = static_cast<std::size_t>(I);
    bert::gpu::layer_grads g;
    g.query = up.zeros(HH);
    g.key = up.zeros(HH);
    g.value = up.zeros(HH);
    g.attention_out = up.zeros(HH);
    g.intermediate = up.zeros(IH);
    g.output = up.zeros(IH);
    g.query_bias = up.zeros(Hs);
    g.key_bias = up.zeros(Hs);
    g.value_bias = up.zeros(Hs);
    g.attention_out_bias = up.zeros(Hs);
    g.intermediate_bias = up.zeros(Is);
    g.output_bias = up.zeros(Hs);
    g.attention_norm_gamma = up.zeros(Hs);
    g.attention_norm_beta = up.zeros(Hs);
    g.output_norm_gamma = up.zeros(Hs);
    g.output_norm_beta = up.zeros(Hs);
    const void* dx_in = up.add(encode(x_values, type));
    const void* ddy = up.add(encode(dy_values, type));
    const auto* dmask = static_cast<const float*>(up.add(encode(mask, cuda::elem::f32)));
    device_buffer y(static_cast<std::size_t>(N * H) * 4), dx(static_cast<std::size_t>(N * H) * 4);
    DSA_REQUIRE_CUDA(cudaMemset(y.as<void>(), 0xff, y.bytes()));
    DSA_REQUIRE_CUDA(cudaMemset(dx.as<void>(), 0xff, dx.bytes()));

    bert::gpu::layer_shape shape;
    shape.batch = batch;
    shape.seq = seq;
    shape.hidden = H;
    shape.heads = cfg.num_heads;
    shape.intermediate = I;
    shape.eps = cfg.layer_norm_eps;
    shape.hidden_dropout = cfg.hidden_dropout;
    shape.attention_dropout = cfg.attention_dropout;
    shape.type = type;
    shape.pre_norm = placement == bert::layer_norm_placement::pre;
    const auto id = static_cast<std::uint32_t>(layer);
    const bert::gpu::layer_streams streams{ctx.stream(id, bert::site::attention_probs),
                                           ctx.stream(id, bert::site::attention_output),
                                           ctx.stream(id, bert::site::ffn_output)};
    auto engine = cuda::gemm_engine::open();
    REQUIRE(engine);
    test_stream stream;
    {
      bert::gpu::layer_stash stash;
      bert::gpu::layer_forward(**engine, w, shape, streams, dx_in, dmask, y.as<void>(), stash, stream.get());
      bert::gpu::layer_backward(**engine, w, g, shape, streams, stash, ddy, dx.as<void>(), stream.get());
      stream.sync();
    }
    const double tol = (type == cuda::elem::f32 ? test::gpu_f32_vs_cpu : test::gpu_half_vs_cpu).rel;
    // Error relative to the reference's norm, or to `scale`'s where the reference is zero
    // up to rounding: the key bias's gradient (softmax ignores a shift shared by a row).
    auto compare = [&](const char* name, const void* got, cuda::elem got_type, const tensor& ref,
                       const tensor* scale = nullptr) {
      const auto n = static_cast<std::size_t>(ref.numel());
      std::vector<std::uint8_t> bytes(n * static_cast<std::size_t>(cuda::elem_size(got_type)));
      DSA_REQUIRE_CUDA(cudaMemcpy(bytes.data(), got, bytes.size(), cudaMemcpyDeviceToHost));
      const std::vector<float> values = decode(bytes, got_type), expected = values_of(ref);
      const double err = distance(values, expected) / norm(scale ? values_of(*scale) : expected);
      INFO(std::string(name) << ": relative error " << err);
      CHECK(err <= tol);
    };
    compare("y", y.as<void>(), type, y_ref);
    compare("dx", dx.as<void>(), type, dx_ref);
    const std::pair<const char*, std::pair<const float*, const tensor*>> grads[] = {
        {"query", {g.query, &lp.query.dweight}},
        {"key", {g.key, &lp.key.dweight}},
        {"value", {g.value, &lp.value.dweight}},
        {"attention_out", {g.attention_out, &lp.attention_out.dweight}},
        {"intermediate", {g.intermediate, &lp.intermediate.dweight}},
        {"output", {g.output, &lp.output.dweight}},
        {"query bias", {g.query_bias, &lp.query.dbias}},
        {"key bias", {g.key_bias, &lp.key.dbias}},
        {"value bias", {g.value_bias, &lp.value.dbias}},
        {"attention_out bias", {g.attention_out_bias, &lp.attention_out.dbias}},
        {"intermediate bias", {g.intermediate_bias, &lp.intermediate.dbias}},
        {"output bias", {g.output_bias, &lp.output.dbias}},
        {"attention norm gamma", {g.attention_norm_gamma, &lp.attention_norm.dweight}},
        {"attention norm beta", {g.attention_norm_beta, &lp.attention_norm.dbias}},
        {"output norm gamma", {g.output_norm_gamma, &lp.output_norm.dweight}},
        {"output norm beta", {g.output_norm_beta, &lp.output_norm.dbias}}};
    for (const auto& [name, pair] : grads)
      compare(name, pair.first, cuda::elem::f32, *pair.second,
              pair.second == &lp.key.dbias ? &lp.query.dbias : nullptr);
  }
}

} // namespace

TEST_CASE("cuda encoder layer equals the CPU layer forward and backward, dropout on (post-LN)") {
  layer_against_cpu(bert::layer_norm_placement::post);
}

TEST_CASE("cuda encoder layer equals the CPU layer forward and backward, dropout on (pre-LN)") {
  layer_against_cpu(bert::layer_norm_placement::pre);
}

TEST_CASE("cuda encoder layer refuses heads that do not divide the hidden size") {
  auto engine = cuda::gemm_engine::open();
  REQUIRE(engine);
  bert::gpu::layer_shape shape;
  shape.batch = 1;
  shape.seq = 4;
  shape.hidden = 10;
  shape.heads = 3;
  shape.intermediate = 8;
  bert::gpu::layer_stash stash;
  test_stream stream;
  CHECK_THROWS_WITH(bert::gpu::layer_forward(**engine, {}, shape, {}, nullptr, nullptr, nullptr, stash,
                                             stream.get()),
                    doctest::Contains("heads must divide the hidden size"));
}

} // namespace dsa::test
