// dsactor bench gpu-kernels: the CUDA kernels at BERT-large shapes against the device's
// own copy bandwidth measured in the same run. Each kernel is first checked against its
// CPU twin on a slice of the bench input, then timed with CUDA events (median of reps).
#include "tools/bench_gpu.hpp"

#include "kernels/common/gelu_math.hpp"
#include "kernels/common/layernorm_math.hpp"
#include "kernels/cpu/adam.hpp"
#include "kernels/cuda/activation.hpp"
#include "kernels/cuda/adam.hpp"
#include "kernels/cuda/cuda_allocator.hpp"
#include "kernels/cuda/layernorm.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

namespace dsa::tools {
namespace {

constexpr int warmup = 2, reps = 10;

// Device memory owned for the bench's lifetime.
struct device_array {
  void* ptr = nullptr;
  explicit device_array(std::size_t bytes) { DSA_CUDA_CHECK(cudaMalloc(&ptr, bytes)); }
  ~device_array() { cudaFree(ptr); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  template <class T> T* as() const { return static_cast<T*>(ptr); }
};

// Median milliseconds of `reps` runs of fn on `stream`, timed by events.
double median_ms(cudaStream_t stream, const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  DSA_CUDA_CHECK(cudaEventCreate(&start));
  DSA_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i)
    fn();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    DSA_CUDA_CHECK(cudaEventRecord(start, stream));
    fn();
    DSA_CUDA_CHECK(cudaEventRecord(stop, stream));
    DSA_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0.0f;
    DSA_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::vector<float> random_floats(std::size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& e : v)
    e = dist(gen);
  return v;
}

// Largest |a - b| / (1e-5 + 1e-4 |b|) over a slice: <= 1 passes (the f32 reduction entry
// of tests/support/tolerances.hpp).
double worst_ratio(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst,
                     std::fabs(static_cast<double>(a[i]) - b[i]) / (1e-5 + 1e-4 * std::fabs(b[i])));
  return worst;
}

} // namespace

int bench_gpu_main(int, char**) {
  const cuda::device_probe probe = cuda::probe_devices();
  if (probe.count == 0) {
    fmt::print(stderr, "dsactor bench gpu-kernels: {}\n", probe.message);
    return 3;
  }
  fmt::print("{}\n", probe.message);
  cudaStream_t stream;
  DSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  bool valid = true;

  // The bound: a device-to-device copy, counting bytes read and written.
  const std::size_t copy_bytes = std::size_t{1} << 30;
  device_array src(copy_bytes), dst(copy_bytes);
  DSA_CUDA_CHECK(cudaMemsetAsync(src.ptr, 0, copy_bytes, stream));
  const double copy_ms = median_ms(stream, [&] {
    DSA_CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, copy_bytes, cudaMemcpyDeviceToDevice, stream));
  });
  const double bw = 2.0 * static_cast<double>(copy_bytes) / (copy_ms * 1e-3);
  fmt::print("device copy         {:8.1f} GB/s (read + write; the bound below)\n", bw / 1e9);

  // Fused Adam over BERT-large's 335M parameters, bf16 copy-out: 30 bytes per parameter.
  const std::int64_t n = 335'000'000;
  const auto nn = static_cast<std::size_t>(n);
  device_array p(nn * 4), m(nn * 4), v(nn * 4), g(nn * 4), h(nn * 2);
  const std::size_t check = 4099;
  const auto host_p = random_floats(check, -1.0f, 1.0f, 1),
             host_g = random_floats(check, -0.1f, 0.1f, 2);
  DSA_CUDA_CHECK(cudaMemsetAsync(m.ptr, 0, nn * 4, stream));
  DSA_CUDA_CHECK(cudaMemsetAsync(v.ptr, 0, nn * 4, stream));
  DSA_CUDA_CHECK(cudaMemsetAsync(p.ptr, 0, nn * 4, stream));
  DSA_CUDA_CHECK(cudaMemsetAsync(g.ptr, 0, nn * 4, stream));
  DSA_CUDA_CHECK(cudaMemcpyAsync(p.ptr, host_p.data(), check * 4, cudaMemcpyHostToDevice, stream));
  DSA_CUDA_CHECK(cudaMemcpyAsync(g.ptr, host_g.data(), check * 4, cudaMemcpyHostToDevice, stream));
  cpu::adam_params params;
  params.weight_decay = 0.01f;
  DSA_CUDA_CHECK(cuda::adam_update(p.as<float>(), m.as<float>(), v.as<float>(), g.as<float>(),
                                   h.as<std::uint16_t>(), cuda::elem::bf16,
                                   cpu::make_adam_consts(params), n, stream));
  std::vector<float> gpu_p(check), cpu_p = host_p, cpu_m(check, 0.0f), cpu_v(check, 0.0f);
  DSA_CUDA_CHECK(cudaMemcpyAsync(gpu_p.data(), p.ptr, check * 4, cudaMemcpyDeviceToHost, stream));
  DSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  cpu::adam_update(cpu_p.data(), cpu_m.data(), cpu_v.data(), host_g.data(), nullptr, dtype::bf16,
                   params, static_cast<std::int64_t>(check));
  const bool adam_ok = std::memcmp(gpu_p.data(), cpu_p.data(), check * 4) == 0;
  valid = valid && adam_ok;
  const double adam_ms = median_ms(stream, [&] {
    DSA_CUDA_CHECK(cuda::adam_update(p.as<float>(), m.as<float>(), v.as<float>(), g.as<float>(),
                                     h.as<std::uint16_t>(), cuda::elem::bf16,
                                     cpu::make_adam_consts(params), n, stream));
  });
  const double adam_ratio = 30.0 * static_cast<double>(n) / (adam_ms * 1e-3) / bw;
  fmt::print("adam (bf16 copy)    {:8.3g} params/s  {:5.1f}% of copy bandwidth  check vs CPU: {}\n",
             static_cast<double>(n) / (adam_ms * 1e-3), 100 * adam_ratio,
             adam_ok ? "bit-exact" : "MISMATCH");

  // LayerNorm forward and bias+GELU forward in bf16 at the SQuAD shape (32 x 384 tokens).
  const std::int64_t rows = 32 * 384, hidden = 1024, inter = 4096;
  device_array x(static_cast<std::size_t>(rows * inter) * 2),
      y(static_cast<std::size_t>(rows * inter) * 2);
  device_array gamma(inter * 4), beta(inter * 4), mean(static_cast<std::size_t>(rows) * 4),
      rstd(static_cast<std::size_t>(rows) * 4);
  const auto host_gamma = random_floats(inter, 0.5f, 1.5f, 3),
             host_beta = random_floats(inter, -0.5f, 0.5f, 4);
  DSA_CUDA_CHECK(cudaMemsetAsync(x.ptr, 0, static_cast<std::size_t>(rows * inter) * 2, stream));
  DSA_CUDA_CHECK(
      cudaMemcpyAsync(gamma.ptr, host_gamma.data(), inter * 4, cudaMemcpyHostToDevice, stream));
  DSA_CUDA_CHECK(
      cudaMemcpyAsync(beta.ptr, host_beta.data(), inter * 4, cudaMemcpyHostToDevice, stream));
  // f32 view of the first rows for the check: write f32 data, run the f32 kernel on them.
  const std::int64_t check_rows = 8;
  const auto host_x = random_floats(static_cast<std::size_t>(check_rows * hidden), -2.0f, 3.0f, 5);
  DSA_CUDA_CHECK(
      cudaMemcpyAsync(x.ptr, host_x.data(), host_x.size() * 4, cudaMemcpyHostToDevice, stream));
  DSA_CUDA_CHECK(cuda::layernorm_forward(y.ptr, mean.as<float>(), rstd.as<float>(), x.ptr,
                                         gamma.as<float>(), beta.as<float>(), 1e-12f,
                                         cuda::elem::f32, check_rows, hidden, stream));
  std::vector<float> gpu_y(host_x.size()), twin_y(host_x.size());
  DSA_CUDA_CHECK(
      cudaMemcpyAsync(gpu_y.data(), y.ptr, gpu_y.size() * 4, cudaMemcpyDeviceToHost, stream));
  DSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (std::int64_t r = 0; r < check_rows; ++r) {
    float mu, s;
    common::layernorm_row_forward(twin_y.data() + r * hidden, &mu, &s, host_x.data() + r * hidden,
                                  host_gamma.data(), host_beta.data(), 1e-12f, hidden);
  }
  const bool ln_ok = worst_ratio(gpu_y, twin_y) <= 1.0;
  DSA_CUDA_CHECK(cuda::bias_gelu_forward(y.ptr, x.ptr, beta.as<float>(), cuda::elem::f32,
                                         check_rows, hidden, stream));
  DSA_CUDA_CHECK(
      cudaMemcpyAsync(gpu_y.data(), y.ptr, gpu_y.size() * 4, cudaMemcpyDeviceToHost, stream));
  DSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (std::size_t i = 0; i < twin_y.size(); ++i)
    twin_y[i] = common::bias_gelu_forward_element(host_x[i],
                                                  host_beta[i % static_cast<std::size_t>(hidden)]);
  const bool gelu_ok = worst_ratio(gpu_y, twin_y) <= 1.0;
  valid = valid && ln_ok && gelu_ok;

  const double ln_ms = median_ms(stream, [&] {
    DSA_CUDA_CHECK(cuda::layernorm_forward(y.ptr, mean.as<float>(), rstd.as<float>(), x.ptr,
                                           gamma.as<float>(), beta.as<float>(), 1e-12f,
                                           cuda::elem::bf16, rows, hidden, stream));
  });
  const double ln_ratio = 4.0 * static_cast<double>(rows * hidden) / (ln_ms * 1e-3) / bw;
  fmt::print("layernorm fwd bf16  {:8.1f} GB/s  {:5.1f}% of copy bandwidth  check vs twin: {}\n",
             4.0 * static_cast<double>(rows * hidden) / (ln_ms * 1e-3) / 1e9, 100 * ln_ratio,
             ln_ok ? "ok" : "MISMATCH");
  const double gelu_ms = median_ms(stream, [&] {
    DSA_CUDA_CHECK(cuda::bias_gelu_forward(y.ptr, x.ptr, beta.as<float>(), cuda::elem::bf16, rows,
                                           inter, stream));
  });
  const double gelu_ratio = 4.0 * static_cast<double>(rows * inter) / (gelu_ms * 1e-3) / bw;
  fmt::print("bias+gelu fwd bf16  {:8.1f} GB/s  {:5.1f}% of copy bandwidth  check vs twin: {}\n",
             4.0 * static_cast<double>(rows * inter) / (gelu_ms * 1e-3) / 1e9, 100 * gelu_ratio,
             gelu_ok ? "ok" : "MISMATCH");
  DSA_CUDA_CHECK(cudaStreamDestroy(stream));
  fmt::print(
      "{{\"bench\":\"gpu-kernels\",\"valid\":{},\"copy_gbps\":{:.4g},\"adam_params_per_s\":{:.4g},"
      "\"adam_ratio_to_copy\":{:.4f},\"layernorm_ratio_to_copy\":{:.4f},\"bias_gelu_ratio_to_"
      "copy\":{:.4f}}}\n",
      valid ? "true" : "false", bw / 1e9, static_cast<double>(n) / (adam_ms * 1e-3), adam_ratio,
      ln_ratio, gelu_ratio);
  return valid ? 0 : 1;
}

} // namespace dsa::tools
