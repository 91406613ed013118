// The CUDA pre-training head kernels (kernels/cuda/loss.hpp) against the CPU's
// (kernels/cpu/loss.hpp, kernels/cpu/activation.hpp) on the same rounded inputs:
// cross-entropy's per-row losses, argmax flags (ties included) and gradient, in place and
// not; tanh forward and backward; the row gather and scatter exactly; refusals.
#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/loss.hpp"
#include "kernels/cuda/loss.hpp"

#include "tests/gpu/gpu_test_util.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/random.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace dsa;
using test::device_buffer;
using test::random_vector;

namespace {

constexpr cuda::elem all_types[] = {cuda::elem::f32, cuda::elem::f16, cuda::elem::bf16};
constexpr std::int32_t ignore = -1; // the BERT head's ignored label
constexpr float xent_scale = 0.25f;

std::size_t bytes_of(std::int64_t n, cuda::elem type) {
  return static_cast<std::size_t>(n * cuda::elem_size(type));
}

template <class T> void upload_raw(device_buffer& dst, const std::vector<T>& src) {
  REQUIRE(src.size() * sizeof(T) <= dst.bytes());
  DSA_REQUIRE_CUDA(
      cudaMemcpy(dst.as<void>(), src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice));
}

template <class T> std::vector<T> download_raw(const device_buffer& src, std::size_t n) {
  std::vector<T> out(n);
  DSA_REQUIRE_CUDA(cudaMemcpy(out.data(), src.as<void>(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return out;
}

// All bytes 0xff: NaN in every float type, -1 as int32, so an output not written shows.
void poison(device_buffer& b) {
  DSA_REQUIRE_CUDA(cudaMemset(b.as<void>(), 0xff, b.bytes()));
}

// Logits in [-4, 4) rounded to the type and random labels, with rows >= 5 arranged so that
// the argmax rule is exercised: rows 1 and rows - 1 ignored; rows 0 and 2 hold a tie of two
// maxima (6, exact in every type) at columns a < b, the later one in a lower thread of the
// block at 30522 classes; row 0 is labelled b (not the CPU's argmax, the first maximum),
// row 2 a (its argmax); row 3's label has its logit raised to 7, a unique maximum.
struct xent_case {
  std::vector<float> logits;
  std::vector<std::int32_t> labels;
};

xent_case make_case(cuda::elem type, std::int64_t rows, std::int64_t classes) {
  xent_case k;
  k.logits = random_vector(rows * classes, -4.0f, 4.0f, 71);
  std::mt19937 gen(72);
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(classes - 1));
  for (std::int64_t r = 0; r < rows; ++r)
    k.labels.push_back(pick(gen));
  const std::int64_t a = classes / 3, b = classes - 1;
  for (const std::int64_t r : {std::int64_t{0}, std::int64_t{2}}) {
    k.logits[static_cast<std::size_t>(r * classes + a)] = 6.0f;
    k.logits[static_cast<std::size_t>(r * classes + b)] = 6.0f;
  }
  k.labels[0] = static_cast<std::int32_t>(b);
  k.labels[2] = static_cast<std::int32_t>(a);
  k.logits[static_cast<std::size_t>(3 * classes + k.labels[3])] = 7.0f;
  k.labels[1] = ignore;
  k.labels[static_cast<std::size_t>(rows - 1)] = ignore;
  k.logits = test::round_to(k.logits, type);
  return k;
}

// One cross-entropy case: every output against the CPU, then in place and with single outputs.
void check_cross_entropy(cuda::elem type, std::int64_t rows, std::int64_t classes,
                         const test::test_stream& stream) {
  const xent_case k = make_case(type, rows, classes);
  const std::int64_t n = rows * classes;
  const auto nn = static_cast<std::size_t>(n), nr = static_cast<std::size_t>(rows),
             nc = static_cast<std::size_t>(classes);

  // The CPU row by row for per-row losses and flags, and whole for the sums and gradient.
  std::vector<double> loss_cpu(nr);
  std::vector<std::int32_t> correct_cpu(nr);
  for (std::size_t r = 0; r < nr; ++r) {
    const cpu::xent_sum one =
        cpu::cross_entropy_forward(k.logits.data() + r * nc, &k.labels[r], ignore, 1, classes);
    loss_cpu[r] = one.loss_sum;
    correct_cpu[r] = static_cast<std::int32_t>(one.correct);
  }
  // The case is what it claims to be: the tie rows and the raised row.
  CHECK(correct_cpu[0] == 0);
  CHECK(correct_cpu[2] == 1);
  CHECK(correct_cpu[3] == 1);
  const cpu::xent_sum total =
      cpu::cross_entropy_forward(k.logits.data(), k.labels.data(), ignore, rows, classes);
  std::vector<float> dlogits_cpu(nn);
  cpu::cross_entropy_backward(dlogits_cpu.data(), k.logits.data(), k.labels.data(), ignore,
                              xent_scale, rows, classes);
  dlogits_cpu = test::round_to(dlogits_cpu, type);

  device_buffer d_logits(bytes_of(n, type)), d_labels(nr * 4), d_dlogits(bytes_of(n, type)),
      d_loss(nr * 4), d_correct(nr * 4);
  test::upload(d_logits, test::encode(k.logits, type));
  upload_raw(d_labels, k.labels);
  poison(d_dlogits);
  poison(d_loss);
  poison(d_correct);
  DSA_REQUIRE_CUDA(cuda::cross_entropy(
      d_dlogits.as<void>(), d_loss.as<float>(), d_correct.as<std::int32_t>(), d_logits.as<void>(),
      d_labels.as<std::int32_t>(), ignore, xent_scale, type, rows, classes, stream.get()));
  stream.sync();
  const auto loss = download_raw<float>(d_loss, nr);
  const auto correct = download_raw<std::int32_t>(d_correct, nr);
  const auto dlogits_bytes = test::download_bytes(d_dlogits, d_dlogits.bytes());
  const auto dlogits = test::decode(dlogits_bytes, type);

  CHECK(correct == correct_cpu);
  DSA_CHECK_CLOSE(loss.data(), loss_cpu.data(), rows, test::gpu_f32_reduction);
  double loss_sum = 0.0;
  std::int64_t correct_sum = 0;
  for (std::size_t r = 0; r < nr; ++r) {
    loss_sum += loss[r];
    correct_sum += correct[r];
  }
  DSA_CHECK_CLOSE(&loss_sum, &total.loss_sum, 1, test::gpu_f32_reduction);
  CHECK(correct_sum == total.correct);

  // Gradient: ignored rows all zero bits; elsewhere the probabilities (relative) apart from
  // the label's element, scale * (p - 1), which is near -scale.
  std::vector<float> probs, probs_cpu, at_label, at_label_cpu;
  const auto elem_bytes = static_cast<std::size_t>(cuda::elem_size(type));
  for (std::size_t r = 0; r < nr; ++r) {
    if (k.labels[r] == ignore) {
      INFO("ignored row " << r);
      CHECK(loss[r] == 0.0f);
      const auto first = dlogits_bytes.begin() + static_cast<std::ptrdiff_t>(r * nc * elem_bytes);
      CHECK(std::all_of(first, first + static_cast<std::ptrdiff_t>(nc * elem_bytes),
                        [](std::uint8_t v) { return v == 0; }));
      continue;
    }
    const auto label = static_cast<std::size_t>(k.labels[r]);
    for (std::size_t j = 0; j < nc; ++j) {
      const bool is_label = j == label;
      (is_label ? at_label : probs).push_back(dlogits[r * nc + j]);
      (is_label ? at_label_cpu : probs_cpu).push_back(dlogits_cpu[r * nc + j]);
    }
  }
  DSA_CHECK_CLOSE(probs.data(), probs_cpu.data(), static_cast<std::int64_t>(probs.size()),
                  test::storage_tolerance(type, test::gpu_softmax_probs));
  DSA_CHECK_CLOSE(at_label.data(), at_label_cpu.data(), static_cast<std::int64_t>(at_label.size()),
                  test::storage_tolerance(type, test::gpu_f32_reduction));

  // In place over the logits: the same bits (fixed reduction order, no atomics).
  device_buffer d_in_place(bytes_of(n, type)), d_loss2(nr * 4), d_correct2(nr * 4);
  test::upload(d_in_place, test::encode(k.logits, type));
  poison(d_loss2);
  DSA_REQUIRE_CUDA(cuda::cross_entropy(d_in_place.as<void>(), d_loss2.as<float>(), nullptr,
                                       d_in_place.as<void>(), d_labels.as<std::int32_t>(), ignore,
                                       xent_scale, type, rows, classes, stream.get()));
  stream.sync();
  CHECK(test::download_bytes(d_in_place, d_in_place.bytes()) == dlogits_bytes);
  CHECK(test::download_bytes(d_loss2, nr * 4) == test::download_bytes(d_loss, nr * 4));
  // The flags alone.
  poison(d_correct2);
  DSA_REQUIRE_CUDA(cuda::cross_entropy(nullptr, nullptr, d_correct2.as<std::int32_t>(),
                                       d_logits.as<void>(), d_labels.as<std::int32_t>(), ignore,
                                       xent_scale, type, rows, classes, stream.get()));
  stream.sync();
  CHECK(download_raw<std::int32_t>(d_correct2, nr) == correct_cpu);
}

} // namespace

TEST_CASE("cuda cross_entropy matches the CPU: losses, argmax ties, gradient, in place") {
  const test::test_stream stream;
  struct shape {
    std::int64_t rows, classes;
  };
  // NSP's 2 classes, a size off the block width, and BERT's vocabulary.
  for (const shape s : {shape{7, 2}, shape{13, 1000}, shape{5, 30522}})
    for (const cuda::elem type : all_types) {
      INFO(std::string(test::elem_name(type)) << " rows=" << s.rows << " classes=" << s.classes);
      check_cross_entropy(type, s.rows, s.classes, stream);
    }
}

TEST_CASE("cuda cross_entropy marks a label out of range with NaN, reading nothing past it") {
  const test::test_stream stream;
  const std::int64_t rows = 3, classes = 5;
  // Past the end, in range, and negative but not ignore_index.
  const std::vector<std::int32_t> labels{static_cast<std::int32_t>(classes), 2, -2};
  const auto logits = random_vector(rows * classes, -1.0f, 1.0f, 81);
  device_buffer d_logits(logits.size() * 4), d_labels(labels.size() * 4),
      d_dlogits(logits.size() * 4), d_loss(rows * 4), d_correct(rows * 4);
  test::upload(d_logits, logits);
  upload_raw(d_labels, labels);
  poison(d_dlogits);
  poison(d_loss);
  poison(d_correct);
  DSA_REQUIRE_CUDA(cuda::cross_entropy(
      d_dlogits.as<void>(), d_loss.as<float>(), d_correct.as<std::int32_t>(), d_logits.as<void>(),
      d_labels.as<std::int32_t>(), ignore, 1.0f, cuda::elem::f32, rows, classes, stream.get()));
  stream.sync();
  const auto loss = download_raw<float>(d_loss, 3);
  const auto correct = download_raw<std::int32_t>(d_correct, 3);
  const auto dlogits = test::download(d_dlogits, logits.size(), cuda::elem::f32);
  CHECK(std::isnan(loss[0]));
  CHECK(std::isfinite(loss[1]));
  CHECK(std::isnan(loss[2]));
  CHECK(correct[0] == 0);
  CHECK(correct[2] == 0);
  for (std::int64_t j = 0; j < classes; ++j) {
    CHECK(std::isnan(dlogits[static_cast<std::size_t>(j)]));
    CHECK(std::isfinite(dlogits[static_cast<std::size_t>(classes + j)]));
    CHECK(std::isnan(dlogits[static_cast<std::size_t>(2 * classes + j)]));
  }
}

TEST_CASE("cuda tanh forward and backward match the CPU kernels") {
  const test::test_stream stream;
  for (const cuda::elem type : all_types)
    for (const std::int64_t n : {1, 37, 70001}) {
      INFO(std::string(test::elem_name(type)) << " n=" << n);
      const auto nn = static_cast<std::size_t>(n);
      const auto tol = test::storage_tolerance(type, test::gpu_f32_elementwise);
      const auto x = test::round_to(random_vector(n, -3.0f, 3.0f, 91), type);
      std::vector<float> y_cpu(nn);
      cpu::tanh_forward(y_cpu.data(), x.data(), n);
      y_cpu = test::round_to(y_cpu, type);
      device_buffer d_x(bytes_of(n, type));
      test::upload(d_x, test::encode(x, type));
      // y written over x, as the header allows.
      DSA_REQUIRE_CUDA(cuda::tanh_forward(d_x.as<void>(), d_x.as<void>(), type, n, stream.get()));
      stream.sync();
      const auto y = test::download(d_x, nn, type);
      DSA_CHECK_CLOSE(y.data(), y_cpu.data(), n, tol);

      // Backward from the CPU's stored output, so its error is the backward's alone.
      const auto dy = test::round_to(random_vector(n, -1.0f, 1.0f, 92), type);
      std::vector<float> dx_cpu(nn);
      cpu::tanh_backward(dx_cpu.data(), dy.data(), y_cpu.data(), n);
      dx_cpu = test::round_to(dx_cpu, type);
      device_buffer d_dy(bytes_of(n, type)), d_y(bytes_of(n, type));
      test::upload(d_dy, test::encode(dy, type));
      test::upload(d_y, test::encode(y_cpu, type));
      // dx written over dy.
      DSA_REQUIRE_CUDA(cuda::tanh_backward(d_dy.as<void>(), d_dy.as<void>(), d_y.as<void>(), type,
                                           n, stream.get()));
      stream.sync();
      const auto dx = test::download(d_dy, nn, type);
      DSA_CHECK_CLOSE(dx.data(), dx_cpu.data(), n, tol);
    }
}

TEST_CASE("cuda gather_rows copies rows exactly and scatter_add_rows adds them with one rounding") {
  const test::test_stream stream;
  const std::int64_t rows = 11;
  const std::vector<std::int64_t> index{7, 0, 10, 3, 9, 5}; // distinct, out of order, both ends
  const auto count = static_cast<std::int64_t>(index.size());
  for (const std::int64_t c : {1, 769, 1024})
    for (const cuda::elem type : all_types) {
      INFO(std::string(test::elem_name(type)) << " c=" << c);
      const auto nc = static_cast<std::size_t>(c);
      const auto table = test::round_to(random_vector(rows * c, -2.0f, 2.0f, 101), type);
      const auto grad = test::round_to(random_vector(count * c, -1.0f, 1.0f, 102), type);
      std::vector<float> gathered, scattered = table;
      for (std::size_t i = 0; i < index.size(); ++i) {
        const auto row = static_cast<std::size_t>(index[i]);
        gathered.insert(gathered.end(), table.begin() + static_cast<std::ptrdiff_t>(row * nc),
                        table.begin() + static_cast<std::ptrdiff_t>((row + 1) * nc));
        for (std::size_t j = 0; j < nc; ++j)
          scattered[row * nc + j] += grad[i * nc + j]; // the f32 sum, rounded by encode below
      }
      device_buffer d_table(bytes_of(rows * c, type)), d_grad(bytes_of(count * c, type)),
          d_rows(bytes_of(count * c, type)), d_index(index.size() * 8);
      test::upload(d_table, test::encode(table, type));
      test::upload(d_grad, test::encode(grad, type));
      upload_raw(d_index, index);
      poison(d_rows);
      DSA_REQUIRE_CUDA(cuda::gather_rows(d_rows.as<void>(), d_table.as<void>(),
                                         d_index.as<std::int64_t>(), type, count, c, stream.get()));
      DSA_REQUIRE_CUDA(cuda::scatter_add_rows(d_table.as<void>(), d_grad.as<void>(),
                                              d_index.as<std::int64_t>(), type, count, c,
                                              stream.get()));
      stream.sync();
      CHECK(test::download_bytes(d_rows, d_rows.bytes()) == test::encode(gathered, type));
      // Rows not in the index are untouched; the others hold their sums rounded once.
      CHECK(test::download_bytes(d_table, d_table.bytes()) == test::encode(scattered, type));
    }
}

TEST_CASE("cuda head kernels refuse bad sizes and missing pointers without launching") {
  const test::test_stream stream;
  const cudaStream_t s = stream.get();
  device_buffer a(64 * 4), b(64 * 4), labels(8 * 4), loss(8 * 4), index(8 * 8);
  const auto f32 = cuda::elem::f32;
  void* out = a.as<void>();
  const void* in = b.as<void>();
  const auto* lab = labels.as<std::int32_t>();
  float* l = loss.as<float>();
  const auto* idx = index.as<std::int64_t>();
  const cudaError_t bad = cudaErrorInvalidValue;
  // cross_entropy: no output at all, missing inputs, bad rows or classes.
  CHECK(cuda::cross_entropy(nullptr, nullptr, nullptr, in, lab, ignore, 1.0f, f32, 2, 4, s) == bad);
  CHECK(cuda::cross_entropy(out, l, nullptr, nullptr, lab, ignore, 1.0f, f32, 2, 4, s) == bad);
  CHECK(cuda::cross_entropy(out, l, nullptr, in, nullptr, ignore, 1.0f, f32, 2, 4, s) == bad);
  CHECK(cuda::cross_entropy(out, l, nullptr, in, lab, ignore, 1.0f, f32, -1, 4, s) == bad);
  CHECK(cuda::cross_entropy(out, l, nullptr, in, lab, ignore, 1.0f, f32, 2, 0, s) == bad);
  CHECK(cuda::cross_entropy(out, l, nullptr, in, lab, ignore, 1.0f, f32, 2, std::int64_t{1} << 31,
                            s) == bad);
  // tanh: negative sizes, missing pointers.
  CHECK(cuda::tanh_forward(out, in, f32, -1, s) == bad);
  CHECK(cuda::tanh_forward(nullptr, in, f32, 4, s) == bad);
  CHECK(cuda::tanh_backward(out, in, nullptr, f32, 4, s) == bad);
  CHECK(cuda::tanh_backward(out, in, in, f32, -1, s) == bad);
  // Rows: no index, a zero or negative width, a negative count, too many rows for the grid.
  CHECK(cuda::gather_rows(out, in, nullptr, f32, 2, 4, s) == bad);
  CHECK(cuda::gather_rows(out, in, idx, f32, 2, 0, s) == bad);
  CHECK(cuda::scatter_add_rows(out, in, idx, f32, -1, 4, s) == bad);
  CHECK(cuda::scatter_add_rows(out, nullptr, idx, f32, 2, 4, s) == bad);
  CHECK(cuda::scatter_add_rows(out, in, idx, f32, std::int64_t{1} << 31, 4, s) == bad);
  // Zero rows or elements: success, nothing written.
  poison(a);
  CHECK(cuda::cross_entropy(out, l, nullptr, in, lab, ignore, 1.0f, f32, 0, 4, s) == cudaSuccess);
  CHECK(cuda::tanh_forward(out, in, f32, 0, s) == cudaSuccess);
  CHECK(cuda::tanh_backward(out, in, in, f32, 0, s) == cudaSuccess);
  CHECK(cuda::gather_rows(out, in, idx, f32, 0, 4, s) == cudaSuccess);
  CHECK(cuda::scatter_add_rows(out, in, idx, f32, 0, 4, s) == cudaSuccess);
  stream.sync();
  const auto after = test::download_bytes(a, a.bytes());
  CHECK(std::all_of(after.begin(), after.end(), [](std::uint8_t v) { return v == 0xff; }));
}
