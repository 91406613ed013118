// dsactor bench gpu-kernels: the CUDA kernels at BERT-large shapes against the device's
// own copy bandwidth measured in the same run. Each kernel is first checked against its
// CPU twin on a slice of the bench input, then timed with CUDA events (median of reps).
#include "tools/bench/bench_gpu.hpp"

#include "kernels/common/gelu_math.hpp"
#include "kernels/common/layernorm_math.hpp"
#include "kernels/cpu/adam.hpp"
#include "kernels/cuda/activation.hpp"
#include "kernels/cuda/adam.hpp"
#include "kernels/cuda/cuda_allocator.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/bias.hpp"
#include "kernels/cuda/heads.hpp"
#include "kernels/cuda/layernorm.hpp"
#include "kernels/cuda/residual_layernorm.hpp"
#include "kernels/cuda/softmax.hpp"
#include "models/bert/cuda_layer.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
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

// Fills device memory with random words that are finite, nonzero values of magnitude below 2
// read as bf16, f16 or f32: a random 4 MiB block tiled over the buffer. Timing on zeros can
// run faster than real data.
void fill_random(void* dst, std::size_t bytes, unsigned seed) {
  const std::size_t block = std::min<std::size_t>(bytes, std::size_t{4} << 20) & ~std::size_t{3};
  std::mt19937 gen(seed);
  std::vector<std::uint32_t> words(block / 4);
  // Each 16-bit half: a random sign, the exponent bits 0x3c00 and seven random low bits.
  for (auto& w : words) {
    const std::uint32_t r = gen();
    w = (r & 0x807f807fu) | 0x3c003c00u;
  }
  auto* out = static_cast<char*>(dst);
  DSA_CUDA_CHECK(cudaMemcpy(out, words.data(), block, cudaMemcpyHostToDevice));
  for (std::size_t done = block; done < bytes;) {
    const std::size_t n = std::min(done, bytes - done);
    DSA_CUDA_CHECK(cudaMemcpy(out + done, out, n, cudaMemcpyDeviceToDevice));
    done += n;
  }
}

// bf16 GEMM TFLOP/s through the engine for C(m, n) = A(m, k) op(B), f32 or bf16 output.
double gemm_tflops(cuda::gemm_engine& engine, cudaStream_t stream, std::int64_t m, std::int64_t n,
                   std::int64_t k, bool trans_b, cuda::elem out) {
  const auto es = static_cast<std::size_t>(cuda::elem_size(out));
  device_array a(static_cast<std::size_t>(m * k) * 2), b(static_cast<std::size_t>(k * n) * 2),
      c(static_cast<std::size_t>(m * n) * es);
  fill_random(a.ptr, static_cast<std::size_t>(m * k) * 2, 7);
  fill_random(b.ptr, static_cast<std::size_t>(k * n) * 2, 8);
  cuda::gemm_call call;
  call.a = a.ptr;
  call.b = b.ptr;
  call.c = c.ptr;
  call.ab_type = cuda::elem::bf16;
  call.c_type = out;
  call.shape.m = m;
  call.shape.n = n;
  call.shape.k = k;
  call.shape.trans_b = trans_b ? cpu::transpose::yes : cpu::transpose::no;
  const double ms = median_ms(stream, [&] {
    const status ran = engine.run(call, stream);
    DSA_CHECK(ran, "bench gemm {}x{}x{}: {}", m, n, k, ran ? "" : ran.err().to_string());
  });
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) /
         (ms * 1e-3) / 1e12;
}

// One BERT-large encoder layer (bf16, dropout 0.1, no padding mask) forward + backward at
// (batch, seq): the median milliseconds. The arrays are random; the numbers are timing only.
double layer_ms(cuda::gemm_engine& engine, cudaStream_t stream, std::int64_t batch,
                std::int64_t seq) {
  bert::gpu::layer_shape s;
  s.batch = batch;
  s.seq = seq;
  s.hidden = 1024;
  s.heads = 16;
  s.intermediate = 4096;
  s.hidden_dropout = s.attention_dropout = 0.1f;
  s.type = cuda::elem::bf16;
  const std::int64_t N = s.rows(), H = s.hidden, I = s.intermediate;
  std::vector<std::unique_ptr<device_array>> arrays;
  auto array = [&](std::size_t bytes, bool random) {
    arrays.push_back(std::make_unique<device_array>(bytes));
    if (random)
      fill_random(arrays.back()->ptr, bytes, static_cast<unsigned>(arrays.size()));
    else
      DSA_CUDA_CHECK(cudaMemset(arrays.back()->ptr, 0, bytes));
    return arrays.back()->ptr;
  };
  const auto HH = static_cast<std::size_t>(H * H) * 2, IH = static_cast<std::size_t>(I * H) * 2,
             Hf = static_cast<std::size_t>(H) * 4, If = static_cast<std::size_t>(I) * 4;
  bert::gpu::layer_weights w;
  w.query = array(HH, true);
  w.key = array(HH, true);
  w.value = array(HH, true);
  w.attention_out = array(HH, true);
  w.intermediate = array(IH, true);
  w.output = array(IH, true);
  for (const float** v : {&w.query_bias, &w.key_bias, &w.value_bias, &w.attention_out_bias,
                          &w.output_bias, &w.attention_norm_gamma, &w.attention_norm_beta,
                          &w.output_norm_gamma, &w.output_norm_beta})
    *v = static_cast<const float*>(array(Hf, true));
  w.intermediate_bias = static_cast<const float*>(array(If, true));
  bert::gpu::layer_grads g;
  for (float** m : {&g.query, &g.key, &g.value, &g.attention_out})
    *m = static_cast<float*>(array(HH * 2, false));
  g.intermediate = static_cast<float*>(array(IH * 2, false));
  g.output = static_cast<float*>(array(IH * 2, false));
  for (float** v : {&g.query_bias, &g.key_bias, &g.value_bias, &g.attention_out_bias,
                    &g.output_bias, &g.attention_norm_gamma, &g.attention_norm_beta,
                    &g.output_norm_gamma, &g.output_norm_beta})
    *v = static_cast<float*>(array(Hf, false));
  g.intermediate_bias = static_cast<float*>(array(If, false));
  const auto act = static_cast<std::size_t>(N * H) * 2;
  void* x = array(act, true);
  void* dy = array(act, true);
  void* y = array(act, false);
  void* dx = array(act, false);
  philox_stream rng;
  rng.seed = 1;
  const bert::gpu::layer_streams streams{rng, rng, rng};
  return median_ms(stream, [&] {
    bert::gpu::layer_stash stash;
    bert::gpu::layer_forward(engine, w, s, streams, x, nullptr, y, stash, stream);
    bert::gpu::layer_backward(engine, w, g, s, streams, stash, dy, dx, stream);
  });
}

// The layer's non-product kernels at BERT-large pre-training shapes (batch 64, seq 128, bf16):
// each one's median time, its bytes moved over the copy bandwidth, and how many calls a
// layer's forward and backward make (for its share of the layer's time, printed once the
// layer is timed), to show where the layer's time goes besides the products.
struct kernel_row {
  std::string name;
  int calls = 1;   // per layer forward + backward
  double ms = 0.0; // one call
  double copy_ratio = 0.0;
};

std::vector<kernel_row> layer_kernels(cudaStream_t stream, double bw) {
  const std::int64_t B = 64, T = 128, H = 1024, A = 16, I = 4096, d = H / A, N = B * T;
  const std::int64_t S = B * A * T * T;
  const auto e = cuda::elem::bf16;
  device_array x(static_cast<std::size_t>(N * I) * 2), y(static_cast<std::size_t>(N * I) * 2),
      z(static_cast<std::size_t>(N * I) * 2), f32(static_cast<std::size_t>(N * H) * 4),
      sc(static_cast<std::size_t>(S) * 2), sc2(static_cast<std::size_t>(S) * 2),
      vec(static_cast<std::size_t>(I) * 4), gvec(static_cast<std::size_t>(I) * 4),
      stats(static_cast<std::size_t>(N) * 8);
  fill_random(x.ptr, static_cast<std::size_t>(N * I) * 2, 11);
  fill_random(y.ptr, static_cast<std::size_t>(N * I) * 2, 12);
  fill_random(f32.ptr, static_cast<std::size_t>(N * H) * 4, 13);
  fill_random(sc.ptr, static_cast<std::size_t>(S) * 2, 14);
  fill_random(vec.ptr, static_cast<std::size_t>(I) * 4, 15);
  DSA_CUDA_CHECK(cudaMemset(gvec.ptr, 0, static_cast<std::size_t>(I) * 4));
  float* mean = stats.as<float>();
  float* rstd = stats.as<float>() + N;
  philox_stream rng;
  rng.seed = 3;
  std::vector<kernel_row> rows;
  auto row = [&](const char* name, int calls, double bytes, const std::function<cudaError_t()>& fn) {
    const double ms = median_ms(stream, [&] { DSA_CUDA_CHECK(fn()); });
    rows.push_back({name, calls, ms, bytes / (ms * 1e-3) / bw});
  };
  const double nh = static_cast<double>(N * H), ni = static_cast<double>(N * I), ss = static_cast<double>(S);
  row("split_heads from f32 + bias", 3, nh * 6, [&] {
    return cuda::split_heads(x.ptr, e, f32.ptr, cuda::elem::f32, vec.as<float>(), B, T, A, d, stream);
  });
  row("merge_heads", 4, nh * 4, [&] { return cuda::merge_heads(y.ptr, x.ptr, e, B, T, A, d, stream); });
  row("softmax+dropout fwd", 1, ss * 6, [&] {
    return cuda::softmax_dropout_forward(sc.ptr, sc2.ptr, sc.ptr, nullptr, 0.125f, 0.1f, rng, e, B,
                                         A, T, T, stream);
  });
  row("softmax+dropout bwd", 1, ss * 6, [&] {
    return cuda::softmax_dropout_backward(sc2.ptr, sc2.ptr, sc.ptr, 0.125f, 0.1f, rng, e, B * A * T,
                                          T, stream);
  });
  row("residual LayerNorm fwd", 2, nh * 8, [&] {
    return cuda::residual_layernorm_forward(z.ptr, y.ptr, mean, rstd, x.ptr, vec.as<float>(), x.ptr,
                                            vec.as<float>(), vec.as<float>(), 0.1f, rng, 1e-12f, e,
                                            N, H, stream);
  });
  row("residual LayerNorm bwd", 2, nh * 8, [&] {
    return cuda::residual_layernorm_backward(z.ptr, x.ptr, gvec.as<float>(), gvec.as<float>(),
                                             gvec.as<float>(), y.ptr, y.ptr, mean, rstd,
                                             vec.as<float>(), 0.1f, rng, e, N, H, stream);
  });
  row("bias+GELU fwd", 1, ni * 4, [&] {
    return cuda::bias_gelu_forward(y.ptr, x.ptr, vec.as<float>(), e, N, I, stream);
  });
  row("bias+GELU bwd", 1, ni * 6, [&] {
    return cuda::bias_gelu_backward(z.ptr, y.ptr, x.ptr, vec.as<float>(), e, N, I, stream);
  });
  // The attention output's and the output's exits and the three projections; each call reads
  // another quarter of x (64 MiB in all, past the L2 cache) so repetitions do not hit it.
  int quarter = 0;
  row("bias gradient, 1024 columns", 5, nh * 2, [&] {
    const void* from = static_cast<const char*>(x.ptr) + static_cast<std::size_t>(quarter++ % 4) * N * H * 2;
    return cuda::bias_backward(gvec.as<float>(), from, e, N, H, stream);
  });
  row("bias gradient, 4096 columns", 1, ni * 2, [&] {
    return cuda::bias_backward(gvec.as<float>(), x.ptr, e, N, I, stream);
  });
  return rows;
}

// The rows with each kernel's share of a layer's forward + backward (`layer_ms`, the same
// shape): calls x one call's time over the layer's.
void print_layer_kernels(const std::vector<kernel_row>& rows, double layer_ms) {
  fmt::print("layer kernels, bf16, batch 64 seq 128 (one call's time; [calls a layer makes]; their share of the "
             "layer's fwd+bwd {:.3f} ms)\n",
             layer_ms);
  double total = 0.0;
  for (const kernel_row& r : rows) {
    total += r.calls * r.ms;
    fmt::print("  {:<32} [{}] {:7.3f} ms  {:6.1f}% of copy bandwidth  {:5.1f}% of the layer\n", r.name, r.calls, r.ms,
               100.0 * r.copy_ratio, 100.0 * r.calls * r.ms / layer_ms);
  }
  fmt::print("  {:<32}     {:7.3f} ms  {:>28}  {:5.1f}% of the layer\n", "all of them", total, "",
             100.0 * total / layer_ms);
}

} // namespace

double bf16_gemm_peak_tflops(cudaStream_t stream) {
  auto engine = cuda::gemm_engine::open();
  DSA_CHECK(engine, "{}", engine ? "" : engine.err().to_string());
  return gemm_tflops(**engine, stream, 8192, 8192, 8192, false, cuda::elem::bf16);
}

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
  DSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  fill_random(x.ptr, static_cast<std::size_t>(rows * inter) * 2, 6);
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

  // cuBLASLt bf16 GEMMs: the peak at 8192^3, then BERT-large's layer products at the SQuAD
  // shape (12288 tokens): QKV, attention output, FF1, FF2 forward (weights stored (out, in),
  // so B is transposed) and FF1's weight gradient (f32 output, as the accumulators are).
  auto engine = cuda::gemm_engine::open();
  DSA_CHECK(engine, "{}", engine ? "" : engine.err().to_string());
  const double peak = gemm_tflops(**engine, stream, 8192, 8192, 8192, false, cuda::elem::bf16);
  fmt::print("bf16 gemm 8192^3    {:8.1f} TFLOP/s (the peak below)\n", peak);
  struct shape {
    const char* name;
    std::int64_t m, n, k;
    bool trans_b;
    cuda::elem out;
  };
  const shape shapes[] = {{"qkv fwd", rows, 3 * hidden, hidden, true, cuda::elem::bf16},
                          {"attn out fwd", rows, hidden, hidden, true, cuda::elem::bf16},
                          {"ff1 fwd", rows, inter, hidden, true, cuda::elem::bf16},
                          {"ff2 fwd", rows, hidden, inter, true, cuda::elem::bf16},
                          {"ff1 dgrad", rows, hidden, inter, false, cuda::elem::bf16},
                          {"ff1 wgrad f32", inter, hidden, rows, false, cuda::elem::f32}};
  double flops = 0.0, seconds = 0.0;
  for (const shape& sh : shapes) {
    const double tf = gemm_tflops(**engine, stream, sh.m, sh.n, sh.k, sh.trans_b, sh.out);
    const double f = 2.0 * static_cast<double>(sh.m) * static_cast<double>(sh.n) *
                     static_cast<double>(sh.k);
    flops += f;
    seconds += f / (tf * 1e12);
    fmt::print("bf16 gemm {:<13} {:5}x{:5}x{:5} {:8.1f} TFLOP/s  {:5.1f}% of the peak\n", sh.name,
               sh.m, sh.n, sh.k, tf, 100 * tf / peak);
  }
  const double layer_ratio = flops / seconds / 1e12 / peak;
  // The kernels' stream-ordered scratch (the bias gradient's) stays in the default pool
  // between calls, as in training (cuda_allocator sets the same), so the timings are the
  // kernels' and not the pool's mapping memory back in after each synchronisation.
  {
    int device = 0;
    cudaMemPool_t pool = nullptr;
    std::uint64_t keep = UINT64_MAX;
    DSA_CUDA_CHECK(cudaGetDevice(&device));
    DSA_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    DSA_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  const std::vector<kernel_row> kernels = layer_kernels(stream, bw);

  // The whole GPU encoder layer (models/bert/cuda_layer.hpp) forward + backward at the
  // pre-training and SQuAD shapes: model FLOPs as bench_torch_bert.py counts them (the
  // layer's products, 3x forward), against the peak. tools/bench/bench_torch_bert.py --layer times
  // HuggingFace's BertLayer at the same shapes.
  struct layer_case {
    std::int64_t batch, seq;
  };
  double layer_mfu[2] = {0.0, 0.0}, layer128_ms = 0.0;
  int li = 0;
  for (const layer_case lc : {layer_case{64, 128}, layer_case{32, 384}}) {
    const double ms = layer_ms(**engine, stream, lc.batch, lc.seq);
    if (lc.seq == 128) layer128_ms = ms;
    const double tokens = static_cast<double>(lc.batch * lc.seq);
    const double f = 3.0 * tokens *
                     (2.0 * (4.0 * hidden * hidden + 2.0 * hidden * inter) +
                      4.0 * static_cast<double>(lc.seq) * hidden);
    const double tf = f / (ms * 1e-3) / 1e12;
    layer_mfu[li++] = tf / peak;
    fmt::print("bert-large layer fwd+bwd bf16 batch {:3} seq {:3}: {:7.3f} ms  {:6.1f} TFLOP/s  "
               "{:5.1f}% of the peak\n",
               lc.batch, lc.seq, ms, tf, 100 * tf / peak);
  }
  print_layer_kernels(kernels, layer128_ms);
  // The bias gradients' worst ratio to the copy bandwidth (the goal: at least 0.6; 0: none timed).
  double bias_grad_ratio = 0.0;
  bool timed = false;
  for (const kernel_row& r : kernels)
    if (r.name.rfind("bias gradient", 0) == 0) {
      bias_grad_ratio = timed ? std::min(bias_grad_ratio, r.copy_ratio) : r.copy_ratio;
      timed = true;
    }
  DSA_CUDA_CHECK(cudaStreamDestroy(stream));
  fmt::print(
      "{{\"bench\":\"gpu-kernels\",\"valid\":{},\"copy_gbps\":{:.4g},\"adam_params_per_s\":{:.4g},"
      "\"adam_ratio_to_copy\":{:.4f},\"layernorm_ratio_to_copy\":{:.4f},\"bias_gelu_ratio_to_"
      "copy\":{:.4f},\"bf16_gemm_peak_tflops\":{:.4g},\"bert_large_gemm_ratio_to_peak\":{:.4f},"
      "\"layer_mfu_seq128\":{:.4f},\"layer_mfu_seq384\":{:.4f},\"bias_grad_ratio_to_copy\":{:.4f}}}\n",
      valid ? "true" : "false", bw / 1e9, static_cast<double>(n) / (adam_ms * 1e-3), adam_ratio,
      ln_ratio, gelu_ratio, peak, layer_ratio, layer_mfu[0], layer_mfu[1], bias_grad_ratio);
  return valid ? 0 : 1;
}

} // namespace dsa::tools
