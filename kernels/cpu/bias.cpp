// Bias add over rows and its gradient (column sums). Large problems are split
// across OpenMP threads: bias_add by rows, bias_backward by column blocks so
// that no two threads write the same dbias element.
#include "kernels/cpu/bias.hpp"

#include "core/error.hpp"

#include <algorithm>

namespace dsa::cpu {
namespace {

// Below this many elements of y / dy one thread does all the work.
constexpr std::int64_t parallel_threshold = std::int64_t{1} << 16;
// Columns per block of bias_backward: its double accumulators stay in L1.
constexpr std::int64_t column_block = 256;

void check_sizes(std::int64_t rows, std::int64_t c, const char* what) {
  DSA_CHECK(rows >= 0 && c >= 0, "{}: rows = {}, c = {}", what, rows, c);
}

// dbias[j0, j1) += sum over rows of dy[:, j0, j1), summed in double.
void column_sums(float* dbias, const float* dy, std::int64_t rows, std::int64_t c, std::int64_t j0,
                 std::int64_t j1) {
  double acc[column_block] = {};
  const std::int64_t width = j1 - j0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = dy + r * c + j0;
#pragma omp simd
    for (std::int64_t j = 0; j < width; ++j) acc[j] += static_cast<double>(row[j]);
  }
  for (std::int64_t j = 0; j < width; ++j)
    dbias[j0 + j] = static_cast<float>(static_cast<double>(dbias[j0 + j]) + acc[j]);
}

} // namespace

void bias_add(float* y, const float* bias, std::int64_t rows, std::int64_t c) {
  check_sizes(rows, c, "bias_add");
  const bool parallel = rows * c >= parallel_threshold;
#pragma omp parallel for schedule(static) if (parallel)
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = y + r * c;
#pragma omp simd
    for (std::int64_t j = 0; j < c; ++j) row[j] += bias[j];
  }
}

void bias_backward(float* dbias, const float* dy, std::int64_t rows, std::int64_t c) {
  check_sizes(rows, c, "bias_backward");
  const std::int64_t blocks = (c + column_block - 1) / column_block;
  const bool parallel = rows * c >= parallel_threshold && blocks > 1;
#pragma omp parallel for schedule(static) if (parallel)
  for (std::int64_t block = 0; block < blocks; ++block) {
    const std::int64_t j0 = block * column_block;
    column_sums(dbias, dy, rows, c, j0, std::min(c, j0 + column_block));
  }
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
