// How weights reach the GPU part: a new version's upload on a stream of its own, part by
// part, with the forward waiting for each part's copies only (part::upload_version); and
// ZeRO-3's bindings, a part's values and gradients put on the device just before the part
// is enqueued and freed after it (part::set_gate). See cuda_part.hpp.
#include "models/bert/cuda_part_impl.hpp"

#include "core/device_waits.hpp"
#include "kernels/cuda/cuda_allocator.hpp"

#include <fmt/format.h>

namespace dsa::bert::gpu {

version_upload::~version_upload() {
  if (stream) cudaStreamSynchronize(stream); // no copy left reading host memory or writing the weights
  for (const piece& p : pieces)
    if (p.uploaded) cudaEventDestroy(p.uploaded);
  if (compute_mark) cudaEventDestroy(compute_mark);
  if (stream) cudaStreamDestroy(stream);
}

void version_upload::order(cudaStream_t compute, std::int64_t id) const {
  if (!recorded) return;
  for (const piece& p : pieces)
    if (p.id == id) {
      check_cuda(cudaStreamWaitEvent(compute, p.uploaded, 0), "ordering a part's compute after its weights' upload");
      return;
    }
}

void version_upload::order_all(cudaStream_t compute) const {
  if (recorded && !pieces.empty())
    check_cuda(cudaStreamWaitEvent(compute, pieces.back().uploaded, 0), "ordering after a version's upload");
}

void part::upload_version(const std::vector<tensor>& values) {
  impl& m = *impl_;
  version_upload& u = m.upload;
  if (values.size() != m.params.size())
    throw std::runtime_error(fmt::format("GPU BERT: a version of {} tensors for a part of {} parameters", values.size(),
                                         m.params.size()));
  if (!m.resident)
    throw std::runtime_error("GPU BERT: upload_version of a part whose gate binds its parameters (ZeRO-3)");
  if (!u.stream) {
    check_cuda(cudaStreamCreateWithFlags(&u.stream, cudaStreamNonBlocking), "creating the weights' upload stream");
    check_cuda(cudaEventCreateWithFlags(&u.compute_mark, cudaEventDisableTiming), "creating an upload event");
    for (version_upload::piece& p : u.pieces)
      check_cuda(cudaEventCreateWithFlags(&p.uploaded, cudaEventDisableTiming), "creating an upload event");
  }
  // The copies overwrite weights that the work enqueued so far on the part's stream reads.
  check_cuda(cudaEventRecord(u.compute_mark, m.stream), "marking the compute before an upload");
  check_cuda(cudaStreamWaitEvent(u.stream, u.compute_mark, 0), "ordering an upload after the compute");
  u.recorded = false;
  try {
    for (version_upload::piece& p : u.pieces) {
      for (std::size_t i : p.entries) load_value_on(m, i, values[i], u.stream);
      check_cuda(cudaEventRecord(p.uploaded, u.stream), "marking a part's upload");
    }
  } catch (...) {
    cudaStreamSynchronize(u.stream); // what was enqueued ends before anything reads the weights
    throw;
  }
  u.recorded = true;
}

void part::wait_upload_read() {
  version_upload& u = impl_->upload;
  if (!u.stream) return;
  device_wait("cudaStreamSynchronize (a version's upload has read its host values)");
  check_cuda(cudaStreamSynchronize(u.stream), "the weights' upload");
}

namespace {

// The entries part `id` reads (parameters_read_by: the pre-training head's decoder reads the
// tied word embedding too).
const std::vector<std::size_t>& entries_read(const part::impl& m, std::int64_t id) {
  static const std::vector<std::size_t> none;
  const auto it = m.reads.find(id);
  return it == m.reads.end() ? none : it->second;
}

} // namespace

bind_upload::~bind_upload() {
  if (stream) cudaStreamSynchronize(stream); // no copy left reading a staging array or writing a weight
  if (bound) cudaEventDestroy(bound);
  if (compute_mark) cudaEventDestroy(compute_mark);
  if (stream) cudaStreamDestroy(stream);
}

void bind_upload::make() {
  if (stream) return;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  std::string why;
  cudaMemPool_t from = cuda::binding_pool(device, why);
  if (!from) throw std::runtime_error("GPU BERT: the binding memory pool could not be made: " + why);
  // All or nothing: a half-made set is not left behind.
  cudaStream_t s = nullptr;
  cudaEvent_t a = nullptr, c = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&a, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    if (c) cudaEventDestroy(c);
    if (a) cudaEventDestroy(a);
    if (s) cudaStreamDestroy(s);
    check_cuda(e, "creating the weights' bind stream and events");
  }
  pool = from;
  stream = s;
  bound = a;
  compute_mark = c;
}

void bind_upload::order(cudaStream_t compute) {
  if (!pending) return;
  check_cuda(cudaEventRecord(bound, stream), "marking a part's bound weights");
  check_cuda(cudaStreamWaitEvent(compute, bound, 0), "ordering a part's compute after its weights' copies");
  pending = false;
}

void begin_part(part::impl& m, std::int64_t id, bool backward) {
  m.upload.order(m.stream, id);
  if (!m.gate) return;
  m.gate->enter(id);
  m.bind.order(m.stream); // the part's copies are in before it computes
  for (std::size_t i : entries_read(m, id)) {
    const device_param& p = m.params[i];
    if (!m.value(i) || (backward && !p.gradient.get()))
      throw std::runtime_error(fmt::format("GPU BERT: range {}: parameter {}'s {} is not bound as part {} of the {} "
                                           "starts (the gate's bindings)",
                                           m.range.to_string(), i, m.value(i) ? "gradient" : "value", id,
                                           backward ? "backward" : "forward"));
  }
}

void end_part(part::impl& m, std::int64_t id) {
  if (m.gate) m.gate->leave(id);
}

void part::set_gate(part_gate* gate) {
  if (gate && impl_->resident)
    throw std::runtime_error("GPU BERT: a gate for a part whose parameters are resident (made with resident true)");
  impl_->gate = gate;
}

bool part::resident() const { return impl_->resident; }

void part::bind_value(std::size_t i, const tensor& value) {
  impl& m = *impl_;
  device_param& p = m.params.at(i);
  if (m.resident) throw std::runtime_error("GPU BERT: bind_value on a part whose parameters are resident");
  bind_upload& b = m.bind;
  b.make();
  device_array& read = p.working_copy ? p.working : p.master;
  const bool fresh = !read.get();
  if (!fresh) { // bound already (a persistent tensor's next version): after the compute's reads of it
    check_cuda(cudaEventRecord(b.compute_mark, m.stream), "marking the compute before a rebind");
    check_cuda(cudaStreamWaitEvent(b.stream, b.compute_mark, 0), "ordering a rebind after the compute");
  } else {
    read = device_array(static_cast<std::size_t>(p.numel * (p.working_copy ? cuda::elem_size(m.type) : 4)), b.stream,
                        b.pool);
    read.free_on(m.stream); // the compute waits for the bind stream (bind.order) before it reads, then frees
  }
  b.pending = true;
  // From pageable memory the copy has read `value` when this returns; from pinned memory the
  // caller keeps it unchanged until the bind stream has passed the copy.
  try {
    load_value_on(m, i, value, b.stream, b.pool);
  } catch (...) {
    if (fresh) { // not left bound unfilled
      b.order(m.stream);
      read = device_array();
    }
    throw;
  }
}

void part::bind_after(cudaEvent_t event) {
  impl& m = *impl_;
  if (m.resident) throw std::runtime_error("GPU BERT: bind_after on a part whose parameters are resident");
  m.bind.make();
  check_cuda(cudaStreamWaitEvent(m.bind.stream, event, 0), "ordering a part's bindings after an earlier part's end");
}

cudaStream_t part::bind_stream() {
  impl& m = *impl_;
  if (m.resident) throw std::runtime_error("GPU BERT: bind_stream of a part whose parameters are resident");
  m.bind.make();
  return m.bind.stream;
}

void part::unbind_value(std::size_t i) {
  impl& m = *impl_;
  m.bind.order(m.stream); // a value bound and dropped unread: its free after its copy
  device_param& p = m.params.at(i);
  p.master = device_array(); // freed on the part's stream, after the work enqueued on it
  p.working = device_array();
}

void part::bind_gradient(std::size_t i) {
  impl& m = *impl_;
  device_param& p = m.params.at(i);
  if (m.resident) throw std::runtime_error("GPU BERT: bind_gradient on a part whose parameters are resident");
  const auto bytes = static_cast<std::size_t>(p.numel) * 4;
  m.bind.make();
  if (!p.gradient.get()) p.gradient = device_array(bytes, m.stream, m.bind.pool);
  check_cuda(cudaMemsetAsync(p.gradient.get(), 0, bytes, m.stream), "zeroing a bound gradient");
}

void part::unbind_gradient(std::size_t i, cudaStream_t after) {
  device_array& g = impl_->params.at(i).gradient;
  if (after) g.free_on(after);
  g = device_array();
}

} // namespace dsa::bert::gpu
