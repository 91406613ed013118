// The GPU part's parameters: the device copy of a range's bert_parameters, values in and
// gradients out, and the AdamW step (cuda::adam_update: masters and moments in f32, the
// working copy written in the same pass).
#include "models/bert/cuda_part_impl.hpp"

#include "core/device_waits.hpp"
#include "kernels/cuda/adam.hpp"
#include "kernels/cuda/convert.hpp"
#include "models/bert/bert_part.hpp"

#include <fmt/format.h>

#include <mutex>
#include <optional>
#include <vector>

namespace dsa::bert::gpu {
namespace {

// The position in `params` of the entry whose value `view` shares (the typed views share
// the entries' storage; the tied word embedding of a range with the embeddings and the
// head is one entry).
std::size_t index_of(const bert_parameters& params, const tensor& view, const char* what) {
  const auto& entries = params.entries();
  for (std::size_t i = 0; i < entries.size(); ++i)
    if (entries[i].value.defined() && entries[i].value.raw_data() == view.raw_data())
      return i;
  throw std::runtime_error(fmt::format("GPU BERT: no parameter entry holds the {}", what));
}

std::size_t linear_index(const bert_parameters& params, const linear_params& l, std::size_t& bias,
                         const char* what) {
  bias = index_of(params, l.bias, what);
  return index_of(params, l.weight, what);
}

std::optional<cuda::elem> elem_of(dtype t) {
  switch (t) {
  case dtype::f32: return cuda::elem::f32;
  case dtype::f16: return cuda::elem::f16;
  case dtype::bf16: return cuda::elem::bf16;
  default: return std::nullopt;
  }
}

} // namespace

namespace {

// The CUDA pinning behind core/pinned_memory.hpp's owner, installed on first use.
void install_cuda_pinning() {
  static std::once_flag once;
  std::call_once(once, [] {
    pinned_backend b;
    b.name = "cudaMallocHost";
    b.pin = [](std::size_t bytes, std::string& why) -> void* {
      void* p = nullptr;
      const cudaError_t e = cudaMallocHost(&p, bytes);
      if (e == cudaSuccess) return p;
      why = fmt::format("cudaMallocHost: {}", cudaGetErrorString(e));
      (void)cudaGetLastError(); // an allocation failure is not sticky: clear it
      return nullptr;
    };
    b.unpin = [](void* p) { cudaFreeHost(p); }; // at teardown there is nobody left to tell of a failure
    pinned_owner::instance().set_backend(std::move(b));
  });
}

} // namespace

pinned_buffer::~pinned_buffer() { pinned_owner::instance().release(block_); }

pinned_buffer::pinned_buffer(pinned_buffer&& other) noexcept : block_(other.block_) { other.block_ = pinned_block{}; }

pinned_buffer& pinned_buffer::operator=(pinned_buffer&& other) noexcept {
  if (this != &other) {
    pinned_owner::instance().release(block_);
    block_ = other.block_;
    other.block_ = pinned_block{};
  }
  return *this;
}

void pinned_buffer::reserve(std::size_t bytes, std::string_view what) {
  if (block_.ptr && bytes <= block_.bytes)
    return;
  if (block_.ptr) {
    device_wait("cudaFreeHost (a pinned buffer grows; it waits for the device)");
    pinned_owner::instance().release(block_);
  }
  install_cuda_pinning();
  block_ = pinned_owner::instance().acquire(bytes, what);
}

loss_readout::~loss_readout() {
  if (copied)
    cudaEventDestroy(copied);
}

loss_readout::loss_readout(loss_readout&& other) noexcept
    : host(std::move(other.host)), copied(other.copied), at(other.at), valid(other.valid) {
  other.copied = nullptr;
  other.valid = false;
}

loss_readout& loss_readout::operator=(loss_readout&& other) noexcept {
  if (this != &other) {
    if (copied)
      cudaEventDestroy(copied);
    host = std::move(other.host);
    copied = other.copied;
    other.copied = nullptr;
    at = other.at;
    valid = other.valid;
    other.valid = false;
  }
  return *this;
}

layer_weights part::impl::weights(const layer_index& l) const {
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

layer_grads part::impl::grads(const layer_index& l) const {
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

part::part(const bert_parameters& params, cuda::elem type, cudaStream_t stream, bool deterministic, bool masters,
           bool resident)
    : impl_(std::make_unique<impl>()) {
  impl& m = *impl_;
  if (!resident && masters)
    throw std::runtime_error("GPU BERT: a part whose parameters a gate binds (ZeRO-3) keeps no f32 masters");
  m.deterministic = deterministic;
  m.resident = resident;
  m.cfg = params.config();
  m.range = params.range();
  m.type = type;
  m.stream = stream;
  if (const status valid = m.range.validate(m.cfg); !valid)
    throw std::runtime_error("GPU BERT: " + valid.err().to_string());
  auto engine = cuda::gemm_engine::open(32u << 20, deterministic);
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

  for (const auto& e : params.entries()) {
    if (!e.value.defined()) // the layout below is found through the values (not resident: not copied)
      throw std::runtime_error(fmt::format("GPU BERT: parameter {} has no value (a ZeRO-3 partition?)", e.spec.name));
    device_param p;
    p.shape = e.spec.shape;
    p.numel = shape_numel(e.spec.shape);
    const bool matrix = p.shape.size() == 2; // the products' matrices and the embedding tables
    p.working_copy = matrix && type != cuda::elem::f32;
    p.decay = matrix;
    m.masters = m.masters && (masters || !p.working_copy);
    m.params.push_back(std::move(p));
  }
  if (resident) {
    for (device_param& p : m.params) {
      const auto bytes = static_cast<std::size_t>(p.numel) * 4;
      if (masters || !p.working_copy) p.master = device_array(bytes, stream);
      if (p.working_copy) p.working = device_array(static_cast<std::size_t>(p.numel * cuda::elem_size(type)), stream);
      p.gradient = device_array(bytes, stream);
    }
    for (std::size_t i = 0; i < m.params.size(); ++i)
      load_value(i, params.entries()[i].value);
    zero_gradients();
  }

  if (m.range.has_embeddings()) {
    const embeddings_params& e = params.embeddings();
    m.word = index_of(params, e.word, "word embedding");
    m.position = index_of(params, e.position, "position embedding");
    m.token_type = index_of(params, e.token_type, "token type embedding");
    m.embedding_gamma = index_of(params, e.norm.weight, "embeddings' LayerNorm");
    m.embedding_beta = index_of(params, e.norm.bias, "embeddings' LayerNorm");
  }
  for (std::int64_t l = m.range.first_layer; l < m.range.last_layer; ++l) {
    const layer_params& p = params.layer(l);
    layer_index li{};
    li.query = linear_index(params, p.query, li.query_bias, "query");
    li.key = linear_index(params, p.key, li.key_bias, "key");
    li.value = linear_index(params, p.value, li.value_bias, "value");
    li.attention_out = linear_index(params, p.attention_out, li.attention_out_bias, "attention output");
    li.attention_gamma = index_of(params, p.attention_norm.weight, "attention LayerNorm");
    li.attention_beta = index_of(params, p.attention_norm.bias, "attention LayerNorm");
    li.intermediate = linear_index(params, p.intermediate, li.intermediate_bias, "intermediate");
    li.output = linear_index(params, p.output, li.output_bias, "output");
    li.output_gamma = index_of(params, p.output_norm.weight, "output LayerNorm");
    li.output_beta = index_of(params, p.output_norm.bias, "output LayerNorm");
    m.layers.push_back(li);
  }
  if (m.final_norm()) {
    m.final_gamma = index_of(params, params.final_norm().weight, "final LayerNorm (pre-LN)");
    m.final_beta = index_of(params, params.final_norm().bias, "final LayerNorm (pre-LN)");
  }
  if (m.squad()) {
    m.qa = linear_index(params, params.squad_head().qa_outputs, m.qa_bias, "SQuAD span head (qa_outputs)");
  } else if (m.range.has_head()) {
    const pretraining_head_params& h = params.pretraining_head();
    m.decoder_word = index_of(params, h.word, "tied word embedding");
    m.pooler = linear_index(params, h.pooler, m.pooler_bias, "pooler");
    m.transform = linear_index(params, h.transform, m.transform_bias, "MLM transform");
    m.transform_gamma = index_of(params, h.transform_norm.weight, "MLM LayerNorm");
    m.transform_beta = index_of(params, h.transform_norm.bias, "MLM LayerNorm");
    m.decoder_bias = index_of(params, h.decoder_bias, "decoder bias");
    m.relationship = linear_index(params, h.seq_relationship, m.relationship_bias, "NSP classifier");
  }
  // The forward's parts in order, each with the entries it reads, for upload_version.
  auto add_piece = [&](std::int64_t id) {
    m.upload.pieces.push_back({id, parameters_finished_by(params, id), nullptr});
    m.reads[id] = parameters_read_by(params, id);
  };
  if (m.range.has_embeddings()) add_piece(backward_options::embeddings_done);
  for (std::int64_t l = m.range.first_layer; l < m.range.last_layer; ++l) add_piece(l);
  if (m.range.has_head()) add_piece(backward_options::head_done);
  std::size_t covered = 0;
  for (const auto& piece : m.upload.pieces) covered += piece.entries.size();
  if (covered != m.params.size())
    throw std::runtime_error(fmt::format("GPU BERT: the forward's parts read {} of range {}'s {} parameters", covered,
                                         m.range.to_string(), m.params.size()));
  device_wait("cudaStreamSynchronize (uploading the parameters)");
  check_cuda(cudaStreamSynchronize(stream), "uploading the parameters");
}

part::~part() = default;

const bert_config& part::config() const { return impl_->cfg; }
const bert_range& part::range() const { return impl_->range; }
cuda::elem part::type() const { return impl_->type; }
cudaStream_t part::stream() const { return impl_->stream; }
std::size_t part::size() const { return impl_->params.size(); }
std::int64_t part::parameter_count() const {
  std::int64_t n = 0;
  for (const device_param& p : impl_->params)
    n += p.numel;
  return n;
}

void part::load_value(std::size_t i, const tensor& value) {
  impl_->upload.order_all(impl_->stream); // not beside an upload_version's copies of the same arrays
  load_value_on(*impl_, i, value, impl_->stream);
}

void load_value_on(part::impl& m, std::size_t i, const tensor& value, cudaStream_t stream, cudaMemPool_t pool) {
  device_param& p = m.params.at(i);
  const auto from = value.defined() ? elem_of(value.type()) : std::nullopt;
  if (!from || value.numel() != p.numel || !value.is_contiguous())
    throw std::runtime_error(fmt::format("GPU BERT: parameter {} given as {}, expected {} contiguous f32, f16 or "
                                         "bf16 elements",
                                         i, value.defined() ? value.describe() : "(none)", p.numel));
  if (!p.master.get()) { // the working copy alone (masters off): straight in, or through f32
    const auto bytes = static_cast<std::size_t>(p.numel * cuda::elem_size(*from));
    if (*from == m.type) {
      check_cuda(cudaMemcpyAsync(p.working.get(), value.raw_data(), bytes, cudaMemcpyHostToDevice, stream),
                 "uploading a parameter");
      return;
    }
    device_array staged(bytes, stream, pool), wide;
    check_cuda(cudaMemcpyAsync(staged.get(), value.raw_data(), bytes, cudaMemcpyHostToDevice, stream),
               "uploading a parameter");
    const void* f32 = staged.get();
    if (*from != cuda::elem::f32) {
      wide = device_array(static_cast<std::size_t>(p.numel) * 4, stream, pool);
      check_cuda(cuda::convert(wide.get(), cuda::elem::f32, staged.get(), *from, p.numel, stream),
                 "widening a parameter");
      f32 = wide.get();
    }
    check_cuda(cuda::convert(p.working.get(), m.type, f32, cuda::elem::f32, p.numel, stream),
               "a parameter's working copy");
    return;
  }
  if (*from == cuda::elem::f32) {
    check_cuda(cudaMemcpyAsync(p.master.get(), value.raw_data(), static_cast<std::size_t>(p.numel) * 4,
                               cudaMemcpyHostToDevice, stream),
               "uploading a parameter");
  } else {
    const auto bytes = static_cast<std::size_t>(p.numel * cuda::elem_size(*from));
    device_array staged(bytes, stream, pool);
    check_cuda(cudaMemcpyAsync(staged.get(), value.raw_data(), bytes, cudaMemcpyHostToDevice, stream),
               "uploading a parameter");
    check_cuda(cuda::convert(p.master.get(), cuda::elem::f32, staged.get(), *from, p.numel, stream),
               "widening a parameter");
  }
  if (p.working_copy)
    check_cuda(cuda::convert(p.working.get(), m.type, p.master.get(), cuda::elem::f32, p.numel, stream),
               "a parameter's working copy");
}

void part::optimizer_step(const cpu::adam_params& params) {
  impl& m = *impl_;
  if (!m.masters)
    throw std::runtime_error("GPU BERT: optimizer_step of a part made without f32 masters (its optimizer is elsewhere)");
  m.upload.order_all(m.stream);
  // Every moment first, so an allocation failure leaves no parameter updated.
  for (device_param& p : m.params) {
    const auto bytes = static_cast<std::size_t>(p.numel) * 4;
    if (!p.m.get()) {
      p.m = device_array(bytes, m.stream);
      p.v = device_array(bytes, m.stream);
      check_cuda(cudaMemsetAsync(p.m.get(), 0, bytes, m.stream), "zeroing a moment");
      check_cuda(cudaMemsetAsync(p.v.get(), 0, bytes, m.stream), "zeroing a moment");
    }
  }
  cpu::adam_params no_decay = params;
  no_decay.weight_decay = 0.0f;
  const common::adam_consts decayed = cpu::make_adam_consts(params), plain = cpu::make_adam_consts(no_decay);
  for (device_param& p : m.params)
    check_cuda(cuda::adam_update(p.master.as<float>(), p.m.as<float>(), p.v.as<float>(), p.gradient.as<float>(),
                                 p.working_copy ? p.working.as<std::uint16_t>() : nullptr, m.type,
                                 p.decay ? decayed : plain, p.numel, m.stream),
               "the AdamW step");
  zero_gradients();
}

void part::zero_gradients() {
  for (device_param& p : impl_->params)
    if (p.gradient.get()) // a part without resident parameters zeroes what is bound
      check_cuda(cudaMemsetAsync(p.gradient.get(), 0, static_cast<std::size_t>(p.numel) * 4, impl_->stream),
               "zeroing a gradient");
}

const float* part::gradient_data(std::size_t i) const { return impl_->params.at(i).gradient.as<float>(); }

std::int64_t part::numel(std::size_t i) const { return impl_->params.at(i).numel; }

namespace {

void download(const std::vector<device_param>& params, const std::vector<tensor>& into, bool gradients,
              cudaStream_t stream) {
  if (into.size() != params.size())
    throw std::runtime_error(fmt::format("GPU BERT: {} host tensors for {} parameters", into.size(), params.size()));
  for (std::size_t i = 0; i < params.size(); ++i) {
    const device_param& p = params[i];
    const tensor& t = into[i];
    if (!t.defined() || t.type() != dtype::f32 || t.numel() != p.numel || !t.is_contiguous())
      throw std::runtime_error(fmt::format("GPU BERT: parameter {} downloaded into {}, expected {} f32 elements", i,
                                           t.defined() ? t.describe() : "(none)", p.numel));
    const void* from = gradients ? p.gradient.get() : p.master.get();
    if (!from)
      throw std::runtime_error(fmt::format("GPU BERT: parameter {}'s {} is not on the device (a part whose gate binds "
                                           "its parameters)",
                                           i, gradients ? "gradient" : "value"));
    check_cuda(cudaMemcpyAsync(t.raw_data(), from,
                               static_cast<std::size_t>(p.numel) * 4, cudaMemcpyDeviceToHost, stream),
               "downloading a parameter");
  }
  device_wait("cudaStreamSynchronize (downloading parameters or gradients)");
  check_cuda(cudaStreamSynchronize(stream), "downloading the parameters");
}

} // namespace

void part::download_gradients(const std::vector<tensor>& into) { download(impl_->params, into, true, impl_->stream); }

void part::download_values(const std::vector<tensor>& into) {
  if (!impl_->masters)
    throw std::runtime_error("GPU BERT: download_values of a part made without f32 masters (its optimizer keeps them)");
  impl_->upload.order_all(impl_->stream);
  download(impl_->params, into, false, impl_->stream);
}

} // namespace dsa::bert::gpu
