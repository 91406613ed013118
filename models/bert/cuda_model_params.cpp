// The GPU model's parameters: upload from bert_parameters, gradients and values back, and
// the AdamW step (cuda::adam_update: masters and moments in f32, the working copy written
// in the same pass).
#include "models/bert/cuda_model_impl.hpp"

#include "kernels/cuda/adam.hpp"
#include "kernels/cuda/convert.hpp"

#include <fmt/format.h>

#include <cstring>
#include <vector>

namespace dsa::bert::gpu {
namespace {

std::size_t add(pretraining_model::impl& m, const tensor& value, const tensor& grad, bool matrix) {
  if (!value.defined() || value.type() != dtype::f32 || !grad.defined())
    throw std::runtime_error("GPU BERT: the parameters must be f32 values with gradients");
  device_param p;
  p.value = &value;
  p.grad = &grad;
  p.numel = value.numel();
  p.working_copy = matrix && m.type != cuda::elem::f32;
  p.decay = matrix;
  const auto bytes = static_cast<std::size_t>(p.numel) * 4;
  p.master = device_array(bytes, m.stream);
  check_cuda(cudaMemcpyAsync(p.master.get(), value.raw_data(), bytes, cudaMemcpyHostToDevice, m.stream),
             "uploading a parameter");
  if (p.working_copy) {
    p.working = device_array(static_cast<std::size_t>(p.numel * cuda::elem_size(m.type)), m.stream);
    check_cuda(cuda::convert(p.working.get(), m.type, p.master.get(), cuda::elem::f32, p.numel, m.stream),
               "a parameter's working copy");
  }
  p.gradient = device_array(bytes, m.stream);
  check_cuda(cudaMemsetAsync(p.gradient.get(), 0, bytes, m.stream), "zeroing a gradient");
  m.params.push_back(std::move(p));
  return m.params.size() - 1;
}

std::size_t add_linear(pretraining_model::impl& m, const linear_params& l, std::size_t& bias) {
  const std::size_t w = add(m, l.weight, l.dweight, true);
  bias = add(m, l.bias, l.dbias, false);
  return w;
}

} // namespace

layer_weights pretraining_model::impl::weights(const layer_index& l) const {
  layer_weights w;
  w.query = value(l.query);
  w.key = value(l.key);
  w.value = value(l.value);
  w.attention_out = value(l.attention_out);
  w.intermediate = value(l.intermediate);
  w.output = value(l.output);
  w.query_bias = f32(l.query_bias);
  w.key_bias = f32(l.key_bias);
  w.value_bias = f32(l.value_bias);
  w.attention_out_bias = f32(l.attention_out_bias);
  w.intermediate_bias = f32(l.intermediate_bias);
  w.output_bias = f32(l.output_bias);
  w.attention_norm_gamma = f32(l.attention_gamma);
  w.attention_norm_beta = f32(l.attention_beta);
  w.output_norm_gamma = f32(l.output_gamma);
  w.output_norm_beta = f32(l.output_beta);
  return w;
}

layer_grads pretraining_model::impl::grads(const layer_index& l) const {
  layer_grads g;
  g.query = grad(l.query);
  g.key = grad(l.key);
  g.value = grad(l.value);
  g.attention_out = grad(l.attention_out);
  g.intermediate = grad(l.intermediate);
  g.output = grad(l.output);
  g.query_bias = grad(l.query_bias);
  g.key_bias = grad(l.key_bias);
  g.value_bias = grad(l.value_bias);
  g.attention_out_bias = grad(l.attention_out_bias);
  g.intermediate_bias = grad(l.intermediate_bias);
  g.output_bias = grad(l.output_bias);
  g.attention_norm_gamma = grad(l.attention_gamma);
  g.attention_norm_beta = grad(l.attention_beta);
  g.output_norm_gamma = grad(l.output_gamma);
  g.output_norm_beta = grad(l.output_beta);
  return g;
}

pretraining_model::pretraining_model(const bert_parameters& params, cuda::elem type, cudaStream_t stream)
    : impl_(std::make_unique<impl>()), stream_(stream) {
  impl& m = *impl_;
  m.cfg = params.config();
  m.type = type;
  m.stream = stream;
  if (type == cuda::elem::f16)
    throw std::runtime_error("GPU BERT: f16 storage is not tested on the GPU (it needs loss scaling: the "
                             "decoder's gradients underflow f16); use bf16 or f32");
  if (m.cfg.norm != layer_norm_placement::post)
    throw std::runtime_error("GPU BERT: only post-LN (BERT's, HF's) runs on the GPU so far");
  if (m.cfg.head != head_kind::pretraining)
    throw std::runtime_error("GPU BERT: only the pre-training head runs on the GPU so far");
  const memory_flags& f = m.cfg.memory;
  if (f.normalize_invertible || f.gelu_checkpoint || f.attn_dropout_checkpoint)
    throw std::runtime_error("GPU BERT: the memory flags (normalize_invertible, gelu_checkpoint, "
                             "attn_dropout_checkpoint) do not run on the GPU yet");
  auto engine = cuda::gemm_engine::open();
  if (!engine)
    throw std::runtime_error("GPU BERT: " + engine.err().to_string());
  // Keep freed blocks in the device's pool across the step's wait: with the default
  // threshold of 0 the driver may take the step's activations back at every sync and map
  // them again the next step.
  int device = 0;
  cudaMemPool_t pool = nullptr;
  std::uint64_t keep = ~std::uint64_t{0};
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
  check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "the pool's release threshold");
  m.engine = std::move(engine.value());

  const embeddings_params& e = params.embeddings();
  m.word = add(m, e.word, e.dword, true);
  m.position = add(m, e.position, e.dposition, true);
  m.token_type = add(m, e.token_type, e.dtoken_type, true);
  m.embedding_gamma = add(m, e.norm.weight, e.norm.dweight, false);
  m.embedding_beta = add(m, e.norm.bias, e.norm.dbias, false);
  for (std::int64_t l = 0; l < m.cfg.num_layers; ++l) {
    const layer_params& p = params.layer(l);
    layer_index li{};
    li.query = add_linear(m, p.query, li.query_bias);
    li.key = add_linear(m, p.key, li.key_bias);
    li.value = add_linear(m, p.value, li.value_bias);
    li.attention_out = add_linear(m, p.attention_out, li.attention_out_bias);
    li.attention_gamma = add(m, p.attention_norm.weight, p.attention_norm.dweight, false);
    li.attention_beta = add(m, p.attention_norm.bias, p.attention_norm.dbias, false);
    li.intermediate = add_linear(m, p.intermediate, li.intermediate_bias);
    li.output = add_linear(m, p.output, li.output_bias);
    li.output_gamma = add(m, p.output_norm.weight, p.output_norm.dweight, false);
    li.output_beta = add(m, p.output_norm.bias, p.output_norm.dbias, false);
    m.layers.push_back(li);
  }
  const pretraining_head_params& h = params.pretraining_head();
  if (h.word.raw_data() != e.word.raw_data())
    throw std::runtime_error("GPU BERT: the decoder must be tied to the word embedding");
  m.pooler = add_linear(m, h.pooler, m.pooler_bias);
  m.transform = add_linear(m, h.transform, m.transform_bias);
  m.transform_gamma = add(m, h.transform_norm.weight, h.transform_norm.dweight, false);
  m.transform_beta = add(m, h.transform_norm.bias, h.transform_norm.dbias, false);
  m.decoder_bias = add(m, h.decoder_bias, h.ddecoder_bias, false);
  m.relationship = add_linear(m, h.seq_relationship, m.relationship_bias);
  check_cuda(cudaStreamSynchronize(stream), "uploading the parameters");
}

pretraining_model::~pretraining_model() = default;

std::int64_t pretraining_model::parameter_count() const {
  std::int64_t n = 0;
  for (const device_param& p : impl_->params)
    n += p.numel;
  return n;
}

void pretraining_model::optimizer_step(const cpu::adam_params& params) {
  // Every moment first, so an allocation failure leaves no parameter updated.
  for (device_param& p : impl_->params) {
    const auto bytes = static_cast<std::size_t>(p.numel) * 4;
    if (!p.m.get()) {
      p.m = device_array(bytes, stream_);
      p.v = device_array(bytes, stream_);
      check_cuda(cudaMemsetAsync(p.m.get(), 0, bytes, stream_), "zeroing a moment");
      check_cuda(cudaMemsetAsync(p.v.get(), 0, bytes, stream_), "zeroing a moment");
    }
  }
  cpu::adam_params no_decay = params;
  no_decay.weight_decay = 0.0f;
  const common::adam_consts decayed = cpu::make_adam_consts(params), plain = cpu::make_adam_consts(no_decay);
  for (device_param& p : impl_->params)
    check_cuda(cuda::adam_update(p.master.as<float>(), p.m.as<float>(), p.v.as<float>(), p.gradient.as<float>(),
                                 p.working_copy ? p.working.as<std::uint16_t>() : nullptr, impl_->type,
                                 p.decay ? decayed : plain, p.numel, stream_),
               "the AdamW step");
  zero_gradients();
}

void pretraining_model::zero_gradients() {
  for (device_param& p : impl_->params)
    check_cuda(cudaMemsetAsync(p.gradient.get(), 0, static_cast<std::size_t>(p.numel) * 4, stream_),
               "zeroing a gradient");
}

namespace {

void download(const std::vector<device_param>& params, bool gradients, cudaStream_t stream) {
  for (const device_param& p : params) {
    const tensor& t = gradients ? *p.grad : *p.value;
    check_cuda(cudaMemcpyAsync(t.raw_data(), gradients ? p.gradient.get() : p.master.get(),
                               static_cast<std::size_t>(p.numel) * 4, cudaMemcpyDeviceToHost, stream),
               "downloading a parameter");
  }
  check_cuda(cudaStreamSynchronize(stream), "downloading the parameters");
}

} // namespace

void pretraining_model::download_gradients() const { download(impl_->params, true, stream_); }

void pretraining_model::download_values() const { download(impl_->params, false, stream_); }

} // namespace dsa::bert::gpu
