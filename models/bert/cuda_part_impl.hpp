// The GPU part's state, shared by cuda_part.cpp (forward and backward), cuda_part_head.cpp
// (the heads' forward and backward) and cuda_part_params.cpp (parameters, gradients,
// optimizer). Internal to models/bert.
#pragma once

#include "models/bert/cuda_part.hpp"

#include <cuda_runtime_api.h>

#include <map>
#include <stdexcept>
#include <string>

namespace dsa::bert::gpu {

// One parameter tensor on the device.
struct device_param {
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  bool working_copy = false; // a matrix or table read in the storage type (half storage)
  // Weight decay applies: the matrices and tables, not biases or LayerNorm parameters (the
  // rule of optim's bert_no_decay, which names the same tensors).
  bool decay = false;
  device_array master;   // f32 values; also what the kernels read without a working copy (none
                         // for a working copy when the part is made without masters)
  device_array working;  // the storage-type copy
  device_array gradient; // f32, accumulated
  device_array m, v;     // AdamW moments, from the first optimizer step
};

// Positions in impl::params of one encoder layer's tensors.
struct layer_index {
  std::size_t query, key, value, attention_out, intermediate, output;
  std::size_t query_bias, key_bias, value_bias, attention_out_bias, intermediate_bias, output_bias;
  std::size_t attention_gamma, attention_beta, output_gamma, output_beta;
};

// The version's working copies uploaded part by part on a stream of their own
// (part::upload_version, cuda_part_upload.cpp): the forward's parts in order (embeddings,
// each layer, the head: backward_options' ids), the entries each reads, and an event after
// their copies, which the compute stream waits for just before it computes that part.
struct version_upload {
  struct piece {
    std::int64_t id = 0;
    std::vector<std::size_t> entries;
    cudaEvent_t uploaded = nullptr;
  };
  std::vector<piece> pieces;
  cudaStream_t stream = nullptr;      // made by the first upload
  cudaEvent_t compute_mark = nullptr; // the compute stream's work before an upload
  bool recorded = false;              // the pieces' events stand for an upload
  version_upload() = default;
  ~version_upload(); // waits for the copies in flight, then frees the stream and events
  version_upload(const version_upload&) = delete;
  version_upload& operator=(const version_upload&) = delete;
  // `compute` waits for piece `id`'s copies (nothing to wait for before the first upload).
  void order(cudaStream_t compute, std::int64_t id) const;
  // `compute` waits for every copy of the last upload (load_value, optimizer_step and
  // download_values touch every parameter).
  void order_all(cudaStream_t compute) const;
};

// ZeRO-3's bindings (part::bind_value) copy on a stream of their own, so a part's weights
// come onto the device while the previous part computes; the compute stream waits for
// `bound` (recorded once the gate's enter has bound a part) before it reads them.
struct bind_upload {
  cudaStream_t stream = nullptr; // made by the first bind_value
  cudaEvent_t bound = nullptr, compute_mark = nullptr;
  // Where bound values and gradients come from (cuda::binding_pool: no allocation waits for
  // another stream's free); found on first use.
  cudaMemPool_t pool = nullptr;
  bool pending = false; // copies enqueued that the compute stream does not wait for yet
  bind_upload() = default;
  ~bind_upload(); // waits for the copies in flight, then frees the stream and events
  bind_upload(const bind_upload&) = delete;
  bind_upload& operator=(const bind_upload&) = delete;
  // The stream, events and pool, once (throws naming what failed, leaving nothing half made).
  void make();
  // The compute stream waits for the copies enqueued so far (nothing when none are pending).
  void order(cudaStream_t compute);
};

struct part::impl {
  bert_config cfg;
  bert_range range;
  cuda::elem type = cuda::elem::bf16;
  cudaStream_t stream = nullptr;
  bool deterministic = false;
  bool masters = true; // every parameter has its f32 master (false: part(..., masters = false))
  bool resident = true; // false: a gate binds each part's values and gradients (ZeRO-3)
  part_gate* gate = nullptr;
  std::unique_ptr<cuda::gemm_engine> engine;
  std::vector<device_param> params; // bert_parameters' order
  // With the embeddings: word, position, token_type, embedding_gamma, embedding_beta.
  std::size_t word = 0, position = 0, token_type = 0, embedding_gamma = 0, embedding_beta = 0;
  std::vector<layer_index> layers; // layers [range.first_layer, range.last_layer)
  // With the head (decoder_word: the tied word embedding the decoder reads).
  std::size_t decoder_word = 0, pooler = 0, pooler_bias = 0, transform = 0, transform_bias = 0, transform_gamma = 0,
              transform_beta = 0, decoder_bias = 0, relationship = 0, relationship_bias = 0;
  // Pre-LN with the head: the final LayerNorm (bert.encoder.final_layernorm) before it.
  std::size_t final_gamma = 0, final_beta = 0;
  bool final_norm() const { return range.has_head() && cfg.norm == layer_norm_placement::pre; }
  // With the SQuAD head: qa_outputs (2, H) and its bias (2).
  std::size_t qa = 0, qa_bias = 0;
  bool squad() const { return range.has_head() && cfg.head == head_kind::squad; }

  // What the kernels read: the working copy, or the f32 master.
  const void* value(std::size_t i) const {
    const device_param& p = params[i];
    return p.working_copy ? p.working.get() : p.master.get();
  }
  const float* f32(std::size_t i) const { return params[i].master.as<float>(); }
  float* grad(std::size_t i) const { return params[i].gradient.as<float>(); }
  layer_weights weights(const layer_index& l) const;
  layer_grads grads(const layer_index& l) const;
  // What each part reads (parameters_read_by), for the gate's check as a part starts.
  std::map<std::int64_t, std::vector<std::size_t>> reads;
  bind_upload bind;      // destroyed after upload, before the parameters (their frees are on `stream`)
  version_upload upload; // last: destroyed first, once its copies have ended
};

// Around each part of the range the forward or backward enqueues (backward_options'
// ids): begin_part orders the compute after the part's version upload and, with a gate,
// has it bind the part's tensors, then checks they are bound (gradients too when
// `backward`); end_part tells the gate the part is enqueued. A throw between them is fatal
// for the part's gate (its bookkeeping stays inside the part): the run ends.
void begin_part(part::impl& m, std::int64_t id, bool backward);
void end_part(part::impl& m, std::int64_t id);

// Entry i's value (f32, f16 or bf16) into its master and working copy, on `stream`
// (part::load_value's, on the part's stream; upload_version's on the upload stream).
// pool: where the conversion's temporaries come from (null: the device's default pool; ZeRO-3's
// bindings pass the binding pool, so no allocation on the bind stream waits for a compute free).
void load_value_on(part::impl& m, std::size_t i, const tensor& value, cudaStream_t stream,
                   cudaMemPool_t pool = nullptr);

inline void check_cuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess)
    throw std::runtime_error("GPU BERT: " + what + " failed: " + cudaGetErrorString(e));
}

// An array uploaded from a host vector (pageable: copied before cudaMemcpyAsync returns).
template <class T> device_array upload(const std::vector<T>& host, cudaStream_t stream) {
  device_array d(host.size() * sizeof(T), stream);
  if (!host.empty())
    check_cuda(cudaMemcpyAsync(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream),
               "uploading the batch");
  return d;
}

template <class T> std::vector<T> values(const tensor& t) {
  const auto* p = static_cast<const T*>(t.raw_data());
  return std::vector<T>(p, p + t.numel());
}

// C = op(A) op(B) (beta 0) or += (beta 1); A and B of the storage type, C f32 or storage.
struct gemm_runner {
  const part::impl& m;
  void operator()(void* c, bool c_f32, const void* a, const void* b, std::int64_t rows, std::int64_t cols,
                  std::int64_t k, bool ta, bool tb, float beta, const char* what) const {
    cuda::gemm_call call;
    call.c = c;
    call.c_type = c_f32 ? cuda::elem::f32 : m.type;
    call.a = a;
    call.b = b;
    call.ab_type = m.type;
    call.shape.m = rows;
    call.shape.n = cols;
    call.shape.k = k;
    call.shape.trans_a = ta ? cpu::transpose::yes : cpu::transpose::no;
    call.shape.trans_b = tb ? cpu::transpose::yes : cpu::transpose::no;
    call.shape.beta = beta;
    const status s = m.engine->run(call, m.stream);
    if (!s)
      throw std::runtime_error(std::string("GPU BERT: ") + what + ": " + s.err().to_string());
  }
};

struct shapes {
  std::int64_t B, T, H, V, N;
};

// The heads (cuda_part_head.cpp). The pre-training head's forward on the range's last
// hidden states fills the stash's head arrays; its backward writes dh, (N, H). The SQuAD
// head's forward: logits (2, N), start row then end row, and with labels each side's cross
// entropy over the sequence's positions, the gradient left in the logits; its backward
// writes dh from them. enqueue_readout: the per-row losses and hits into the stash's pinned
// readout, then its event.
void head_forward(const part::impl& m, const bert_batch& batch, const void* last, const shapes& s, float grad_scale,
                  part_stash& st);
void head_backward(const part::impl& m, const shapes& s, part_stash& st, void* dh);
void squad_forward(const part::impl& m, const bert_batch& batch, const void* last, const shapes& s, float grad_scale,
                   part_stash& st);
void squad_backward(const part::impl& m, const shapes& s, const void* last, part_stash& st, void* dh);
void enqueue_readout(const part::impl& m, part_stash& st);

} // namespace dsa::bert::gpu
