// A new version's upload on a stream of its own, part by part, with the forward waiting for
// each part's copies only; see part::upload_version in cuda_part.hpp.
#include "models/bert/cuda_part_impl.hpp"

#include "core/device_waits.hpp"

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

} // namespace dsa::bert::gpu
