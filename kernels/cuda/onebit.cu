// 1-bit compression kernels on the GPU; see onebit.hpp. One thread per packed byte for the
// signs (8 consecutive elements, as the CPU packs them), a grid-stride double sum of squares
// with a fixed grid, and a one-block pass over the blocks' sums.
#include "kernels/cuda/onebit.hpp"

#include "kernels/cuda/device_math.cuh"

namespace dsa::cuda {
namespace {

constexpr int sum_blocks = 256; // fixed: the sum's order depends on n only

// error = x + error; partial[blockIdx] = this block's sum of y^2.
__global__ void compensate_kernel(const float* x, float* error, double* partial, long long n) {
  __shared__ double scratch[detail::warps_per_block];
  double s = 0.0;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const float y = x[i] + error[i];
    error[i] = y;
    const double d = y;
    s += d * d; // a float's square is exact in double
  }
  s = detail::block_sum(s, scratch);
  if (threadIdx.x == 0)
    partial[blockIdx.x] = s;
}

// *scale = sqrt(sum of the blocks' sums / n), one block.
__global__ void scale_kernel(const double* partial, int blocks, float* scale, long long n) {
  __shared__ double scratch[detail::warps_per_block];
  double s = 0.0;
  for (int b = static_cast<int>(threadIdx.x); b < blocks; b += blockDim.x)
    s += partial[b];
  s = detail::block_sum(s, scratch);
  if (threadIdx.x == 0)
    *scale = n == 0 ? 0.0f : static_cast<float>(sqrt(s / static_cast<double>(n)));
}

// One thread per byte: the signs of y (in error) and the new error.
__global__ void pack_kernel(float* error, std::uint8_t* bits, const float* scale_ptr, long long bytes) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const float scale = *scale_ptr;
  for (long long b = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; b < bytes; b += stride) {
    unsigned byte = 0;
    for (int k = 0; k < 8; ++k) {
      const float y = error[8 * b + k];
      const bool positive = y >= 0.0f;
      byte |= static_cast<unsigned>(positive) << (7 - k);
      error[8 * b + k] = __fsub_rn(y, positive ? scale : -scale);
    }
    bits[b] = static_cast<std::uint8_t>(byte);
  }
}

template <bool Accumulate>
__global__ void unpack_kernel(const std::uint8_t* bits, const float* scale_ptr, float* out, long long bytes) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const float scale = *scale_ptr;
  for (long long b = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; b < bytes; b += stride) {
    const unsigned byte = bits[b];
    for (int k = 0; k < 8; ++k) {
      const float v = __fmul_rn(scale, (byte >> (7 - k)) & 1u ? 1.0f : -1.0f);
      out[8 * b + k] = Accumulate ? __fadd_rn(out[8 * b + k], v) : v;
    }
  }
}

bool bad_size(std::int64_t n) { return n < 0 || n % 8 != 0; }

template <bool Accumulate>
cudaError_t unpack(const std::uint8_t* bits, const float* scale, float* out, std::int64_t n, cudaStream_t stream) {
  if (bad_size(n) || !bits || !scale || !out)
    return cudaErrorInvalidValue;
  if (n > 0)
    unpack_kernel<Accumulate><<<detail::grid_for(n / 8), detail::block_threads, 0, stream>>>(bits, scale, out, n / 8);
  return cudaGetLastError();
}

} // namespace

std::size_t onebit_scratch_bytes() { return sum_blocks * sizeof(double); }

cudaError_t onebit_compress(const float* x, float* error, std::uint8_t* bits, float* scale, std::int64_t n,
                            void* scratch, cudaStream_t stream) {
  if (bad_size(n) || !x || !error || !bits || !scale || !scratch)
    return cudaErrorInvalidValue;
  auto* partial = static_cast<double*>(scratch);
  compensate_kernel<<<sum_blocks, detail::block_threads, 0, stream>>>(x, error, partial, n);
  scale_kernel<<<1, detail::block_threads, 0, stream>>>(partial, sum_blocks, scale, n);
  if (n > 0)
    pack_kernel<<<detail::grid_for(n / 8), detail::block_threads, 0, stream>>>(error, bits, scale, n / 8);
  return cudaGetLastError();
}

cudaError_t onebit_accumulate(const std::uint8_t* bits, const float* scale, float* acc, std::int64_t n,
                              cudaStream_t stream) {
  return unpack<true>(bits, scale, acc, n, stream);
}

cudaError_t onebit_expand(const std::uint8_t* bits, const float* scale, float* out, std::int64_t n,
                          cudaStream_t stream) {
  return unpack<false>(bits, scale, out, n, stream);
}

} // namespace dsa::cuda
