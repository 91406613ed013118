// The CUDA 1-bit kernels (kernels/cuda/onebit.hpp) against their CPU twins
// (kernels/cpu/onebit.hpp): the same signs and errors given the same scale, the scale
// within the double sum's order of the CPU's and the same on every call, the expansions
// exact, bad sizes refused.
#include "kernels/cpu/onebit.hpp"
#include "kernels/cuda/onebit.hpp"

#include "tests/gpu/gpu_test_util.hpp"
#include "tests/support/random.hpp"

#include <cmath>
#include <cstring>

using namespace dsa;
using test::device_buffer;

namespace {

// Sizes: none, one byte, off the block and grid widths, and one larger than a grid pass.
constexpr std::int64_t sizes[] = {0, 8, 64, 8 * 1031, 8 * 70001};

struct compressed {
  std::vector<std::uint8_t> bits;
  std::vector<float> error;
  float scale = 0;
};

compressed on_gpu(const std::vector<float>& x, const std::vector<float>& error0, const test::test_stream& stream) {
  const auto n = static_cast<std::int64_t>(x.size());
  device_buffer dx(x.size() * 4), de(x.size() * 4), db(x.size() / 8), ds(4), scratch(cuda::onebit_scratch_bytes());
  test::upload(dx, x);
  test::upload(de, error0);
  DSA_REQUIRE_CUDA(cuda::onebit_compress(dx.as<float>(), de.as<float>(), db.as<std::uint8_t>(), ds.as<float>(), n,
                                         scratch.as<void>(), stream.get()));
  stream.sync();
  compressed c;
  c.bits = test::download_bytes(db, x.size() / 8);
  c.error = test::download(de, x.size(), cuda::elem::f32);
  const auto s = test::download(ds, 1, cuda::elem::f32);
  c.scale = s[0];
  return c;
}

} // namespace

TEST_CASE("cuda onebit_compress: the CPU twin's signs, errors given its scale, and a deterministic scale") {
  const test::test_stream stream;
  for (std::int64_t n : sizes) {
    INFO("n=" << n);
    auto x = test::random_vector(n, -2.0f, 2.0f, 11);
    auto error0 = test::random_vector(n, -0.5f, 0.5f, 12);
    if (n >= 16) { // zeros of both signs count as +1
      x[3] = 0.0f, error0[3] = 0.0f;
      x[9] = -0.0f, error0[9] = -0.0f;
    }
    compressed cpu{std::vector<std::uint8_t>(static_cast<std::size_t>(n / 8)), error0, 0};
    cpu.scale = cpu::onebit_compress(x.data(), cpu.error.data(), cpu.bits.data(), n);
    const compressed gpu = on_gpu(x, error0, stream);
    CHECK(gpu.bits == cpu.bits);
    CHECK(std::fabs(gpu.scale - cpu.scale) <= test::gpu_onebit_scale.rel * std::fabs(cpu.scale));
    for (std::int64_t i = 0; i < n; ++i) {
      const float y = x[static_cast<std::size_t>(i)] + error0[static_cast<std::size_t>(i)];
      const float want = y - (y >= 0.0f ? gpu.scale : -gpu.scale);
      REQUIRE(std::memcmp(&gpu.error[static_cast<std::size_t>(i)], &want, 4) == 0);
    }
    if (gpu.scale == cpu.scale) CHECK(gpu.error == cpu.error);
    const compressed again = on_gpu(x, error0, stream);
    CHECK(std::memcmp(&again.scale, &gpu.scale, 4) == 0);
    CHECK(again.bits == gpu.bits);
  }
}

TEST_CASE("cuda onebit_accumulate and onebit_expand equal the CPU twins exactly") {
  const test::test_stream stream;
  for (std::int64_t n : sizes) {
    INFO("n=" << n);
    const auto raw = test::random_vector(n / 8, 0.0f, 256.0f, 21);
    std::vector<std::uint8_t> bits(raw.size());
    for (std::size_t b = 0; b < raw.size(); ++b) bits[b] = static_cast<std::uint8_t>(static_cast<int>(raw[b]) & 0xff);
    const float scale = 0.3712f;
    const auto acc0 = test::random_vector(n, -1.0f, 1.0f, 22);
    std::vector<float> acc = acc0, out(static_cast<std::size_t>(n));
    cpu::onebit_accumulate(bits.data(), scale, acc.data(), n);
    cpu::onebit_expand(bits.data(), scale, out.data(), n);
    device_buffer db(bits.size()), ds(4), dacc(acc0.size() * 4), dout(out.size() * 4);
    test::upload(db, bits);
    test::upload(ds, std::vector<float>{scale});
    test::upload(dacc, acc0);
    DSA_REQUIRE_CUDA(cuda::onebit_accumulate(db.as<std::uint8_t>(), ds.as<float>(), dacc.as<float>(), n, stream.get()));
    DSA_REQUIRE_CUDA(cuda::onebit_expand(db.as<std::uint8_t>(), ds.as<float>(), dout.as<float>(), n, stream.get()));
    stream.sync();
    CHECK(test::download(dacc, acc.size(), cuda::elem::f32) == acc);
    CHECK(test::download(dout, out.size(), cuda::elem::f32) == out);
  }
}

TEST_CASE("cuda 1-bit kernels refuse a size that is not a multiple of 8") {
  device_buffer a(64), b(8), s(4), scratch(cuda::onebit_scratch_bytes());
  CHECK(cuda::onebit_compress(a.as<float>(), a.as<float>(), b.as<std::uint8_t>(), s.as<float>(), 12,
                              scratch.as<void>(), nullptr) == cudaErrorInvalidValue);
  CHECK(cuda::onebit_expand(b.as<std::uint8_t>(), s.as<float>(), a.as<float>(), 9, nullptr) == cudaErrorInvalidValue);
  CHECK(cuda::onebit_accumulate(b.as<std::uint8_t>(), s.as<float>(), a.as<float>(), -8, nullptr) ==
        cudaErrorInvalidValue);
}
