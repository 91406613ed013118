// Bias add: a grid-stride loop over the elements. Bias-gradient column sums: one thread per column (consecutive threads read
// consecutive columns of a row, so loads coalesce), rows added in order.
#include "kernels/cuda/bias.hpp"

#include "kernels/cuda/device_math.cuh"

namespace dsa::cuda {
namespace {

template <class T>
__global__ void bias_add_kernel(T* y, const float* x, const float* bias, long long n, long long c) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    y[i] = detail::from_float<T>(x[i] + bias[i % c]);
}

template <class T>
__global__ void bias_backward_kernel(float* dbias, const T* dy, long long rows, long long c) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long j = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; j < c;
       j += stride) {
    float sum = 0.0f;
    for (long long r = 0; r < rows; ++r)
      sum += detail::to_float(dy[r * c + j]);
    dbias[j] += sum;
  }
}

} // namespace

cudaError_t bias_add(void* y, const float* x, const float* bias, elem type, std::int64_t rows,
                     std::int64_t c, cudaStream_t stream) {
  if (rows < 0 || c <= 0 || !y || !x || !bias || rows > (std::int64_t{1} << 62) / c ||
      (type != elem::f32 && static_cast<const void*>(x) == y))
    return cudaErrorInvalidValue;
  if (rows == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    bias_add_kernel<T><<<detail::grid_for(rows * c), detail::block_threads, 0, stream>>>(
        static_cast<T*>(y), x, bias, rows * c, c);
    return cudaGetLastError();
  });
}

cudaError_t bias_backward(float* dbias, const void* dy, elem type, std::int64_t rows,
                          std::int64_t c, cudaStream_t stream) {
  if (rows < 0 || c <= 0 || !dbias || !dy)
    return cudaErrorInvalidValue;
  if (rows == 0)
    return cudaSuccess;
  return detail::dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    bias_backward_kernel<T><<<detail::grid_for(c), detail::block_threads, 0, stream>>>(
        dbias, static_cast<const T*>(dy), rows, c);
    return cudaGetLastError();
  });
}

} // namespace dsa::cuda
