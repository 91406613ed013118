// Bias add over rows and its gradient (column sums). Large problems are split
// across OpenMP threads: bias_add by rows, bias_backward by column blocks so
// that no two threads write the same dbias element. The loops (bias_impl.inc) are
// compiled for the build's target and for AVX-512, chosen by active_isa(), with the
// same bits on both (each column sums its rows in order).
#include "kernels/cpu/bias.hpp"

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/isa.hpp"

#include <algorithm>
#include <vector>

namespace dsa::cpu {
namespace {

// Below this many elements of y / dy one thread does all the work.
constexpr std::int64_t parallel_threshold = std::int64_t{1} << 16;
// Columns per block of bias_backward: its double accumulators stay in L1, and a hidden size
// of 256 still gives the threads four blocks.
constexpr std::int64_t column_block = 64;

void check_sizes(std::int64_t rows, std::int64_t c, const char* what) {
  DSA_CHECK(rows >= 0 && c >= 0, "{}: rows = {}, c = {}", what, rows, c);
}

} // namespace

namespace bias_base {
#include "kernels/cpu/bias_impl.inc"
} // namespace bias_base

DSA_AVX512_REGION_BEGIN
namespace bias_avx512 {
#include "kernels/cpu/bias_impl.inc"
} // namespace bias_avx512
DSA_AVX512_REGION_END

void bias_add(isa path, float* y, const float* bias, std::int64_t rows, std::int64_t c) {
  check_sizes(rows, c, "bias_add");
  check_path(path, "bias");
  if (path == isa::avx512) return bias_avx512::add(y, bias, rows, c);
  bias_base::add(y, bias, rows, c);
}

void bias_backward(isa path, float* dbias, const float* dy, std::int64_t rows, std::int64_t c) {
  check_sizes(rows, c, "bias_backward");
  check_path(path, "bias");
  if (path == isa::avx512) return bias_avx512::backward(dbias, dy, rows, c);
  bias_base::backward(dbias, dy, rows, c);
}

void bias_backward_rounded(isa path, float* dbias, std::uint16_t* dy_bf16, const float* dy, std::int64_t rows,
                           std::int64_t c) {
  check_sizes(rows, c, "bias_backward_rounded");
  check_path(path, "bias");
  const auto out = reinterpret_cast<std::uintptr_t>(dy_bf16), in = reinterpret_cast<std::uintptr_t>(dy);
  const auto n = static_cast<std::uintptr_t>(rows * c);
  DSA_CHECK(out + 2 * n <= in || in + 4 * n <= out, "bias_backward_rounded: dy_bf16 overlaps dy");
  const std::int64_t blocks = (c + column_block - 1) / column_block;
#pragma omp parallel for schedule(static) if (rows * c >= parallel_threshold && blocks > 1)
  for (std::int64_t block = 0; block < blocks; ++block) {
    const std::int64_t j0 = block * column_block, j1 = std::min(c, j0 + column_block);
    // Each slice is rounded while it is in L1 from the column sums' read.
    if (path == isa::avx512)
      bias_avx512::column_sums(dbias, dy, rows, c, j0, j1, dy_bf16);
    else
      bias_base::column_sums(dbias, dy, rows, c, j0, j1, dy_bf16);
  }
}

void bias_add_rounded(isa path, std::uint16_t* out, dtype half, const float* y, const float* bias, std::int64_t rows,
                      std::int64_t c, std::int64_t y_ld) {
  check_sizes(rows, c, "bias_add_rounded");
  check_path(path, "bias");
  DSA_CHECK(half == dtype::f16 || half == dtype::bf16, "bias_add_rounded: output of {}; expected f16 or bf16",
            dtype_name(half));
  DSA_CHECK(y_ld == 0 || y_ld >= c, "bias_add_rounded: input row stride {} below the {} columns", y_ld, c);
  const std::int64_t ld = y_ld == 0 ? c : y_ld;
#pragma omp parallel if (rows * c >= parallel_threshold)
  {
    std::vector<float> row(static_cast<std::size_t>(c));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* in = y + r * ld;
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j) row[static_cast<std::size_t>(j)] = in[j] + bias[j];
      cast(path, out + r * c, half, row.data(), dtype::f32, c);
    }
  }
}

void bias_add(float* y, const float* bias, std::int64_t rows, std::int64_t c) {
  bias_add(active_isa(), y, bias, rows, c);
}

void bias_backward(float* dbias, const float* dy, std::int64_t rows, std::int64_t c) {
  bias_backward(active_isa(), dbias, dy, rows, c);
}

void bias_backward_ref(float* dbias, const float* dy, std::int64_t rows, std::int64_t c) {
  check_sizes(rows, c, "bias_backward_ref");
  for (std::int64_t j = 0; j < c; ++j) {
    double acc = dbias[j];
    for (std::int64_t r = 0; r < rows; ++r) acc += dy[r * c + j];
    dbias[j] = static_cast<float>(acc);
  }
}

} // namespace dsa::cpu
