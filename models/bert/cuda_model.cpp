// The whole GPU pre-training model: one cuda_part over bert_range::whole and its stash.
#include "models/bert/cuda_model.hpp"

#include "core/device_waits.hpp"
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace dsa::bert::gpu {
namespace {

std::vector<tensor> grads_of(const bert_parameters& params) {
  std::vector<tensor> out;
  for (const auto& e : params.entries())
    out.push_back(e.grad);
  return out;
}

std::vector<tensor> values_of(const bert_parameters& params) {
  std::vector<tensor> out;
  for (const auto& e : params.entries())
    out.push_back(e.value);
  return out;
}

} // namespace

pretraining_model::pretraining_model(const bert_parameters& params, cuda::elem type, cudaStream_t stream)
    : host_(params), stream_(stream) {
  if (type == cuda::elem::f16)
    throw std::runtime_error("GPU BERT: f16 storage is not tested on the GPU (it needs loss scaling: the "
                             "decoder's gradients underflow f16); use bf16 or f32");
  if (params.range().first_layer != 0 || params.range().last_layer != params.config().num_layers ||
      !params.range().has_embeddings() || !params.range().has_head())
    throw std::runtime_error("GPU BERT: the pre-training model needs the whole range, not " +
                             params.range().to_string());
  if (params.config().head != head_kind::pretraining)
    throw std::runtime_error("GPU BERT: the pre-training model needs the pre-training head (a SQuAD head runs in "
                             "gpu::part)");
  for (const auto& e : params.entries())
    if (e.value.type() != dtype::f32 || !e.grad.defined())
      throw std::runtime_error("GPU BERT: the parameters must be f32 values with gradients");
  part_ = std::make_unique<part>(params, type, stream);
}

pretraining_model::~pretraining_model() = default;

bert_losses pretraining_model::step(const bert_batch& batch, const forward_context& ctx, float loss_scale) {
  part_->forward(device_array(), batch, ctx, loss_scale, stash_);
  part_->backward(nullptr, stash_);
  device_wait("cudaStreamSynchronize (the whole model's step)");
  if (const cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess)
    throw std::runtime_error(std::string("GPU BERT: the step failed: ") + cudaGetErrorString(e));
  return part_->losses(stash_); // the forward's readout, kept through the backward
}

void pretraining_model::optimizer_step(const cpu::adam_params& params) { part_->optimizer_step(params); }

void pretraining_model::download_gradients() const { part_->download_gradients(grads_of(host_)); }

void pretraining_model::download_values() const { part_->download_values(values_of(host_)); }

void pretraining_model::zero_gradients() { part_->zero_gradients(); }

std::int64_t pretraining_model::parameter_count() const { return part_->parameter_count(); }

} // namespace dsa::bert::gpu
