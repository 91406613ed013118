// 1-bit compression with error feedback on the GPU: the CUDA twins of kernels/cpu/onebit.hpp
// (1-bit Adam's compressed allreduce, io/net/compressed_allreduce.hpp), for buffers in
// device memory. The same format: signs packed 8 to a byte, most significant bit first, a
// set bit meaning +1 (y >= 0, so -0 and +0 count as +1 and NaN as -1); one scale per call,
// the RMS of the compensated values y = x + error.
//
// Bits and errors equal the CPU's bit for bit given the same scale. The scale's sum of
// squares is taken in double (each square exact) in a fixed order for a given n (a fixed
// grid, then one block over the blocks' sums), so it is deterministic but not the CPU's
// order: it can differ from cpu::onebit_sum_of_squares in the last bits of the double,
// which rarely moves the float scale. Every rank of the collective uses the scale its
// sender computed, so ranks still agree exactly. Validated on an H200 (2026-11-28,
// tests/gpu/test_gpu_onebit.cpp: the CPU twins' bits and errors, memcheck clean).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::cuda {

// Bytes of device scratch onebit_compress needs (the blocks' partial sums).
std::size_t onebit_scratch_bytes();

// y = x + error (kept in error), *scale = sqrt(sum y^2 / n) as float (0 for n = 0),
// bits (n / 8 bytes) the signs of y, error = y - scale * sign. n a multiple of 8 (else
// cudaErrorInvalidValue); x may equal error. All pointers device memory; `scale` is
// written on the stream (copy it back, or pass it on to the expansion kernels).
cudaError_t onebit_compress(const float* x, float* error, std::uint8_t* bits, float* scale, std::int64_t n,
                            void* scratch, cudaStream_t stream);

// acc_i += *scale * (bit i ? 1 : -1), n a multiple of 8; scale in device memory.
cudaError_t onebit_accumulate(const std::uint8_t* bits, const float* scale, float* acc, std::int64_t n,
                              cudaStream_t stream);

// out_i = *scale * (bit i ? 1 : -1), n a multiple of 8; scale in device memory.
cudaError_t onebit_expand(const std::uint8_t* bits, const float* scale, float* out, std::int64_t n,
                          cudaStream_t stream);

} // namespace dsa::cuda
