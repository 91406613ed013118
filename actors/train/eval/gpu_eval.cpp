// The GPU evaluation model; see gpu_eval.hpp.
#include "actors/train/eval/gpu_eval.hpp"

#include "kernels/cuda/device_context.hpp"
#include "models/bert/cuda_part.hpp"

#include <fmt/format.h>

#include <memory>
#include <stdexcept>

namespace dsa::train {
namespace {

cuda::elem elem_for(dtype t) {
  switch (t) {
  case dtype::f16: return cuda::elem::f16;
  case dtype::bf16: return cuda::elem::bf16;
  default: return cuda::elem::f32;
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(fmt::format("GPU evaluation: {} failed: {}", what, cudaGetErrorString(e)));
}

// The device copy, its stream and the stash one batch at a time reuses (its pinned
// readout survives between batches).
struct gpu_eval_state {
  int device = 0;
  std::unique_ptr<cuda::stream_handle> stream;
  std::unique_ptr<bert::gpu::part> part;
  bert::gpu::part_stash stash;

  gpu_eval_state(const bert::bert_parameters& whole, int index, dtype working) : device(index) {
    check(cudaSetDevice(device), "cudaSetDevice");
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating the evaluation's stream");
    stream = std::make_unique<cuda::stream_handle>(s);
    part = std::make_unique<bert::gpu::part>(whole, elem_for(working), s);
  }
  ~gpu_eval_state() {
    cudaSetDevice(device); // the stash and the part free in stream order on their device
    stash = bert::gpu::part_stash{};
    part.reset();
  }
  gpu_eval_state(const gpu_eval_state&) = delete;
  gpu_eval_state& operator=(const gpu_eval_state&) = delete;

  bert::part_output forward(const bert::bert_batch& batch) {
    check(cudaSetDevice(device), "cudaSetDevice");
    bert::forward_context ctx;
    ctx.mode = bert::run_mode::eval;
    part->forward(bert::gpu::device_array(), batch, ctx, 1.0f, stash);
    bert::part_output out;
    if (part->config().head == bert::head_kind::squad) out.squad = part->span_logits(stash);
    out.losses = part->losses(stash);
    return out;
  }
};

} // namespace

eval_forward gpu_eval_forward(const bert::bert_parameters& whole, int device, dtype working) {
  auto state = std::make_shared<gpu_eval_state>(whole, device, working);
  return [state](const bert::bert_batch& batch) -> expected<bert::part_output> {
    try {
      return state->forward(batch);
    } catch (const std::exception& e) {
      return make_error(errc::runtime, "{}", e.what());
    }
  };
}

} // namespace dsa::train
