// Helpers for the gpu suite: an owning device buffer, host<->device copies of vectors,
// and host-side rounding to the half types (core/half.hpp, the CPU's conversions).
#pragma once

#include "core/half.hpp"
#include "kernels/cuda/elem.hpp"

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "tests/support/tolerances.hpp"

namespace dsa::test {

// Evaluates a CUDA call once and fails the test case with its error string.
#define DSA_REQUIRE_CUDA(expr)                                                                     \
  do {                                                                                             \
    const cudaError_t dsa_status_ = (expr);                                                        \
    INFO(#expr << ": " << cudaGetErrorString(dsa_status_));                                        \
    REQUIRE(dsa_status_ == cudaSuccess);                                                           \
  } while (0)

// Device memory for one test; plain cudaMalloc so the allocator under test is not needed.
class device_buffer {
public:
  explicit device_buffer(std::size_t bytes) : bytes_(bytes) {
    DSA_REQUIRE_CUDA(cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes));
  }
  ~device_buffer() { cudaFree(ptr_); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  template <class T> T* as() const { return static_cast<T*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

private:
  void* ptr_ = nullptr;
  std::size_t bytes_;
};

// A stream for one test case (kernels never run on the legacy default stream).
class test_stream {
public:
  // Blocking with respect to the legacy stream, so the tests' plain cudaMemcpy and
  // cudaMemset calls are ordered with the kernels.
  test_stream() { DSA_REQUIRE_CUDA(cudaStreamCreate(&stream_)); }
  ~test_stream() { cudaStreamDestroy(stream_); }
  test_stream(const test_stream&) = delete;
  test_stream& operator=(const test_stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void sync() const { DSA_REQUIRE_CUDA(cudaStreamSynchronize(stream_)); }

private:
  cudaStream_t stream_ = nullptr;
};

// Host values stored as `type` (raw words for halves), uploaded; and downloaded back to f32.
inline std::vector<std::uint8_t> encode(const std::vector<float>& v, cuda::elem type) {
  std::vector<std::uint8_t> out(v.size() * static_cast<std::size_t>(cuda::elem_size(type)));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (type == cuda::elem::f32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const std::uint16_t h = type == cuda::elem::f16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

inline std::vector<float> decode(const std::vector<std::uint8_t>& bytes, cuda::elem type) {
  const std::size_t n = bytes.size() / static_cast<std::size_t>(cuda::elem_size(type));
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (type == cuda::elem::f32) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
    } else {
      std::uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      out[i] = type == cuda::elem::f16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
  }
  return out;
}

// v rounded to `type` and back: the values a kernel reading `type` sees.
inline std::vector<float> round_to(const std::vector<float>& v, cuda::elem type) {
  return decode(encode(v, type), type);
}

inline void upload(device_buffer& dst, const std::vector<std::uint8_t>& src) {
  REQUIRE(src.size() <= dst.bytes());
  DSA_REQUIRE_CUDA(cudaMemcpy(dst.as<void>(), src.data(), src.size(), cudaMemcpyHostToDevice));
}
inline void upload(device_buffer& dst, const std::vector<float>& src) {
  REQUIRE(src.size() * 4 <= dst.bytes());
  DSA_REQUIRE_CUDA(cudaMemcpy(dst.as<void>(), src.data(), src.size() * 4, cudaMemcpyHostToDevice));
}
inline std::vector<std::uint8_t> download_bytes(const device_buffer& src, std::size_t bytes) {
  std::vector<std::uint8_t> out(bytes);
  DSA_REQUIRE_CUDA(cudaMemcpy(out.data(), src.as<void>(), bytes, cudaMemcpyDeviceToHost));
  return out;
}
inline std::vector<float> download(const device_buffer& src, std::size_t n, cuda::elem type) {
  return decode(download_bytes(src, n * static_cast<std::size_t>(cuda::elem_size(type))), type);
}

// Outputs stored as `type`: the kernel's f32 entry plus the rounding entry of the half
// type (the f32 difference may carry over into the rounded value).
inline tolerance storage_tolerance(cuda::elem type, tolerance f32) {
  if (type == cuda::elem::f32)
    return f32;
  const tolerance half = type == cuda::elem::f16 ? gpu_f16_storage : gpu_bf16_storage;
  return {f32.abs + half.abs, f32.rel + half.rel, half.reason};
}

inline const char* elem_name(cuda::elem type) {
  return type == cuda::elem::f32 ? "f32" : type == cuda::elem::f16 ? "f16" : "bf16";
}

} // namespace dsa::test
