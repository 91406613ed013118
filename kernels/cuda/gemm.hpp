// Dense and strided-batched GEMM on the GPU through cuBLASLt, with the CPU GEMM's row-major
// conventions (cpu::gemm_shape, cpu::gemm_batch): f32, f16 or bf16 operands, f32
// accumulation, an f32 or same-half output, and an optional bias epilogue.
//
// cuBLASLt is loaded at run time (libcublasLt.so.13), so programs built with CUDA still start
// on machines without the CUDA libraries; opening an engine there is an `unsupported` error
// that says what is missing.
#pragma once

#include "core/error.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cuda/elem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

namespace dsa::cuda {

// What runs after the product: nothing, or a bias over the output's columns (per output
// feature n, broadcast over the m rows), added after alpha * AB + beta * C.
enum class gemm_epilogue : std::uint8_t { none, bias };

// One call. C(m, n) = alpha * op(A) op(B) + beta * C (+ bias), as cpu::gemm_shape describes,
// for each of batch.count entries (strides in elements). A and B are of ab_type; C of
// c_type, which is f32 or, for half operands, ab_type. With beta == 0 C is not read (its
// old contents may be NaN). bias: (n) of c_type (bias_type must equal it: on an H200,
// cuBLASLt 13 had no algorithm for an f32 bias into a bf16 output), with the bias epilogue.
struct gemm_call {
  void* c = nullptr;
  elem c_type = elem::f32;
  const void* a = nullptr;
  const void* b = nullptr;
  elem ab_type = elem::f32;
  cpu::gemm_shape shape;
  cpu::gemm_batch batch;
  gemm_epilogue epilogue = gemm_epilogue::none;
  const void* bias = nullptr;
  elem bias_type = elem::f32;
};

// A cuBLASLt handle, its workspace and the plans (descriptors and the heuristic's algorithm)
// it has made, one per distinct shape, types, alignment and epilogue. Not thread-safe: one
// engine per stream owner (a rank's compute actor).
class gemm_engine {
public:
  // On the current device, with `workspace_bytes` of device memory for cuBLASLt.
  // deterministic: plans take no split-K algorithm (cuBLASLt's reduction schemes masked
  // out), so a product's summation order is the same whatever the heuristic would pick.
  // cuBLASLt's results are otherwise bit-reproducible on one GPU model and library version.
  static expected<std::unique_ptr<gemm_engine>> open(std::size_t workspace_bytes = 32u << 20,
                                                     bool deterministic = false);
  ~gemm_engine();
  gemm_engine(const gemm_engine&) = delete;
  gemm_engine& operator=(const gemm_engine&) = delete;

  // Enqueues the call on `stream`. Bad shapes, types or pointers are invalid_argument errors
  // (nothing launched); a combination cuBLASLt has no algorithm for is `unsupported`.
  status run(const gemm_call& call, cudaStream_t stream);

  // Plans made so far (each distinct call shape makes one, reused afterwards).
  std::size_t plan_count() const;

private:
  struct impl;
  explicit gemm_engine(std::unique_ptr<impl> state);
  std::unique_ptr<impl> impl_;
};

} // namespace dsa::cuda
