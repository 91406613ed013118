// GEMM through OpenBLAS cblas_sgemm (row-major), always single-threaded inside OpenBLAS: a
// GEMM is cut into row blocks by its shape and the blocks spread over OpenMP threads; the
// installed OpenBLAS (0.3.21) has no cblas_sgemm_batch, so a batch of small matrices is
// spread over the threads one entry each.
#include "kernels/cpu/gemm.hpp"

#include "core/error.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/gemm_bf16.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <mutex>
#include <vector>

namespace dsa::cpu {
namespace {

// Shape with leading dimensions resolved (0 -> packed) and checked.
struct resolved_shape {
  gemm_shape s;
  std::int64_t rows_a = 0, cols_a = 0; // A as stored
  std::int64_t rows_b = 0, cols_b = 0; // B as stored
};

resolved_shape resolve(const gemm_shape& shape) {
  resolved_shape r;
  r.s = shape;
  DSA_CHECK(shape.m >= 0 && shape.n >= 0 && shape.k >= 0, "gemm: negative size m={} n={} k={}",
            shape.m, shape.n, shape.k);
  const bool ta = shape.trans_a == transpose::yes, tb = shape.trans_b == transpose::yes;
  r.rows_a = ta ? shape.k : shape.m;
  r.cols_a = ta ? shape.m : shape.k;
  r.rows_b = tb ? shape.n : shape.k;
  r.cols_b = tb ? shape.k : shape.n;
  if (r.s.lda == 0)
    r.s.lda = r.cols_a;
  if (r.s.ldb == 0)
    r.s.ldb = r.cols_b;
  if (r.s.ldc == 0)
    r.s.ldc = shape.n;
  DSA_CHECK(r.s.lda >= r.cols_a, "gemm: lda {} < {} columns of A", r.s.lda, r.cols_a);
  DSA_CHECK(r.s.ldb >= r.cols_b, "gemm: ldb {} < {} columns of B", r.s.ldb, r.cols_b);
  DSA_CHECK(r.s.ldc >= shape.n, "gemm: ldc {} < n {}", r.s.ldc, shape.n);
  return r;
}

// Elements spanned by a stored (rows, cols) matrix with row stride ld.
std::int64_t extent(std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols;
}

} // namespace

void gemm_scale_c(float* c, const gemm_shape& s) {
  for (std::int64_t i = 0; i < s.m; ++i) {
    float* row = c + i * s.ldc;
    for (std::int64_t j = 0; j < s.n; ++j)
      row[j] = s.beta == 0.0f ? 0.0f : s.beta * row[j];
  }
}

namespace {

void gemm_resolved(float* c, const float* a, const float* b, const gemm_shape& s) {
  if (s.m == 0 || s.n == 0)
    return;
  // k == 0: op(A) op(B) is empty; BLAS would also reject lda = 0. Only the beta term remains.
  if (s.k == 0) {
    gemm_scale_c(c, s);
    return;
  }
  constexpr std::int64_t int_max = std::numeric_limits<blasint>::max();
  DSA_CHECK(s.m <= int_max && s.n <= int_max && s.k <= int_max && s.lda <= int_max &&
                s.ldb <= int_max && s.ldc <= int_max,
            "gemm: sizes exceed the BLAS integer (m={} n={} k={})", s.m, s.n, s.k);
  // OpenBLAS honours beta == 0 as "overwrite" (it zeroes C before accumulating);
  // test_gemm checks this with C full of NaN.
  cblas_sgemm(CblasRowMajor, s.trans_a == transpose::yes ? CblasTrans : CblasNoTrans,
              s.trans_b == transpose::yes ? CblasTrans : CblasNoTrans, static_cast<blasint>(s.m),
              static_cast<blasint>(s.n), static_cast<blasint>(s.k), s.alpha, a,
              static_cast<blasint>(s.lda), b, static_cast<blasint>(s.ldb), s.beta, c,
              static_cast<blasint>(s.ldc));
}

// OpenBLAS runs single-threaded, always; dsactor spreads a GEMM over OpenMP threads itself,
// cutting C into row blocks chosen from the shape alone. OpenBLAS 0.3.21 picks its kernels
// by its thread count (single-threaded small-matrix kernels sum k in another order), and that
// count is process-wide: when concurrent pipeline stages changed it, a GEMM's bits depended
// on what the other threads were doing, and two identical runs differed in the 8th digit.
// Now a result depends on the shape and operands only: not on OMP_NUM_THREADS, on being
// called inside a parallel region, or on other threads' GEMMs (test_gemm checks all three).
void blas_single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Row blocks of C: at least 2^21 multiply-adds and min_block_rows rows each, at most 16
// blocks, so a BERT-base projection (4096 x 768 x 768) gets 16 blocks and a tiny one a
// single block. Each block is its own sgemm call, which packs the whole of B again: packing
// k x n costs about what 8 rows of the product do (SkylakeX, f32), so blocks of 16 rows
// spent a third of a weight gradient's time (dW = dY^T X, k = tokens) copying X; 128 rows
// keep that under 7% (perf of a BERT-mini training run on an AVX-512 Xeon: OpenBLAS's
// packing fell from 28% to 16% of the time, samples/s rose 19%).
constexpr std::int64_t min_block_rows = 128;
std::int64_t row_blocks(const gemm_shape& s) {
  const std::int64_t by_work = s.m * s.n * s.k / (std::int64_t{1} << 21);
  return std::max<std::int64_t>(1, std::min<std::int64_t>({16, by_work, s.m / min_block_rows}));
}

// One GEMM in row blocks: concurrently on the OpenMP threads, or one after the other when
// called inside a parallel region (the same blocks, so the same bits).
void gemm_blocks(float* c, const float* a, const float* b, const gemm_shape& s) {
  blas_single_threaded();
  const std::int64_t blocks = row_blocks(s);
  if (blocks == 1) {
    gemm_resolved(c, a, b, s);
    return;
  }
  const std::int64_t rows = (s.m + blocks - 1) / blocks;
  auto run_block = [&](std::int64_t i) {
    const std::int64_t lo = i * rows, hi = std::min(s.m, lo + rows);
    if (lo >= hi) return;
    gemm_shape part = s;
    part.m = hi - lo;
    // Rows lo.. of op(A): rows of A, or columns of a transposed A.
    const float* a_part = s.trans_a == transpose::yes ? a + lo : a + lo * s.lda;
    gemm_resolved(c + lo * s.ldc, a_part, b, part);
  };
  if (omp_in_parallel()) {
    for (std::int64_t i = 0; i < blocks; ++i) run_block(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < blocks; ++i) run_block(i);
}

// Entries of at most this many multiply-adds go one per OpenMP thread: for attention's
// (128 x 64)(64 x 128) products, 1.2x faster than OpenBLAS threading each call (2 cores,
// see the commit). Larger entries with a batch too short to occupy the threads keep
// OpenBLAS's threading inside each call.
constexpr std::int64_t small_entry_madds = std::int64_t{1} << 24;

// Whether to run the entries of a batch concurrently. Entries whose C blocks overlap (a
// stride of 0 included) must stay in order.
bool spread_entries(const gemm_shape& s, const gemm_batch& batch) {
  const int threads = omp_get_max_threads();
  if (batch.count < 2 || threads < 2 || omp_in_parallel() || !gemm_c_disjoint(s, batch))
    return false;
  return batch.count >= threads || s.m * s.n * s.k <= small_entry_madds;
}

void check_batch(const gemm_batch& batch) {
  DSA_CHECK(batch.count >= 0, "gemm_batched: count = {}", batch.count);
  DSA_CHECK(batch.stride_a >= 0 && batch.stride_b >= 0 && batch.stride_c >= 0,
            "gemm_batched: negative stride a={} b={} c={}", batch.stride_a, batch.stride_b,
            batch.stride_c);
}

} // namespace

gemm_shape resolve_gemm_shape(const gemm_shape& shape) { return resolve(shape).s; }

bool gemm_c_disjoint(const gemm_shape& s, const gemm_batch& batch) {
  const std::int64_t c_extent = extent(s.m, s.n, s.ldc);
  return batch.stride_c >= c_extent ||
         (batch.stride_c >= s.n && (batch.count - 1) * batch.stride_c + s.n <= s.ldc);
}

std::int64_t gemm_operand_extent(const gemm_shape& resolved, bool which_a, std::int64_t count, std::int64_t stride) {
  const resolved_shape r = resolve(resolved);
  const std::int64_t one = which_a ? extent(r.rows_a, r.cols_a, r.s.lda) : extent(r.rows_b, r.cols_b, r.s.ldb);
  return count <= 0 || one == 0 ? 0 : (count - 1) * stride + one;
}

void gemm(float* c, const float* a, const float* b, const gemm_shape& shape) {
  if (bf16_operands()) return gemm(c, gemm_operand{a}, gemm_operand{b}, shape);
  gemm_blocks(c, a, b, resolve(shape).s);
}

void gemm_batched(float* c, const float* a, const float* b, const gemm_shape& shape,
                  const gemm_batch& batch) {
  check_batch(batch);
  if (bf16_operands()) return gemm_batched(c, gemm_operand{a}, gemm_operand{b}, shape, batch);
  const gemm_shape s = resolve(shape).s;
  if (!spread_entries(s, batch)) {
    for (std::int64_t i = 0; i < batch.count; ++i)
      gemm_blocks(c + i * batch.stride_c, a + i * batch.stride_a, b + i * batch.stride_b, s);
    return;
  }
  // Entries may share A or B (stride 0) but not C, so they are independent. Concurrent
  // single-threaded sgemm calls are safe in the pthread OpenBLAS (its buffer allocator
  // locks); each entry runs its own row blocks in order, so the bits are the sequential ones.
  blas_single_threaded();
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < batch.count; ++i)
    gemm_blocks(c + i * batch.stride_c, a + i * batch.stride_a, b + i * batch.stride_b, s);
}

gemm_operand gemm_operand::advanced(std::int64_t elements) const {
  return {static_cast<const std::byte*>(data) + elements * static_cast<std::int64_t>(dtype_size(type)), type};
}

namespace {

// The operand's elements as `T` (`want`): the stored ones when already so, else its whole
// stored extent (row padding included, so the leading dimensions still hold) converted into buf.
template <class T>
const T* stored_as(gemm_operand x, dtype want, std::int64_t extent, std::vector<T>& buf) {
  DSA_CHECK(x.type == dtype::f32 || x.type == dtype::f16 || x.type == dtype::bf16,
            "gemm: an operand of {} (f32, f16 or bf16 expected)", dtype_name(x.type));
  if (x.type == want) return static_cast<const T*>(x.data);
  buf.resize(static_cast<std::size_t>(extent));
  cast(buf.data(), want, x.data, x.type, extent);
  return buf.data();
}

} // namespace

void gemm_batched(float* c, gemm_operand a, gemm_operand b, const gemm_shape& shape, const gemm_batch& batch) {
  check_batch(batch);
  const gemm_shape s = resolve(shape).s;
  const std::int64_t na = gemm_operand_extent(s, true, batch.count, batch.stride_a);
  const std::int64_t nb = gemm_operand_extent(s, false, batch.count, batch.stride_b);
  if (bf16_operands()) {
    // Kept by each thread (pipeline stages and attention's sequences call concurrently).
    thread_local std::vector<std::uint16_t> a16, b16;
    return gemm_bf16(c, stored_as(a, dtype::bf16, na, a16), stored_as(b, dtype::bf16, nb, b16), s, batch);
  }
  // Widened copies live for this call only, as a model's widened tensors did.
  std::vector<float> a32, b32;
  gemm_batched(c, stored_as(a, dtype::f32, na, a32), stored_as(b, dtype::f32, nb, b32), s, batch);
}

bool gemm_batched_groups(float* c, gemm_operand a, gemm_operand b, const gemm_shape& shape, const gemm_batch& batch,
                         const gemm_groups& groups) {
  check_batch(batch);
  DSA_CHECK(groups.count >= 0 && groups.stride_a >= 0 && groups.stride_b >= 0 && groups.stride_c >= 0,
            "gemm_batched_groups: {} groups with strides a={} b={} c={}", groups.count, groups.stride_a,
            groups.stride_b, groups.stride_c);
  if (!bf16_operands() || groups.count == 0 || !gemm_bf16_groups_accepted(shape, batch, groups)) return false;
  const gemm_shape s = resolve(shape).s;
  // Each group's operand spans from its start; the last group's end bounds what is read.
  auto extent = [&](bool which_a, std::int64_t group_stride) {
    const std::int64_t one = gemm_operand_extent(s, which_a, batch.count, which_a ? batch.stride_a : batch.stride_b);
    return one == 0 ? 0 : (groups.count - 1) * group_stride + one;
  };
  thread_local std::vector<std::uint16_t> a16, b16;
  return gemm_bf16_groups(c, stored_as(a, dtype::bf16, extent(true, groups.stride_a), a16),
                          stored_as(b, dtype::bf16, extent(false, groups.stride_b), b16), s, batch, groups);
}

void gemm(float* c, gemm_operand a, gemm_operand b, const gemm_shape& shape) { gemm_batched(c, a, b, shape, {}); }

void gemm_ref(float* c, const float* a, const float* b, const gemm_shape& shape,
              const gemm_batch& batch) {
  check_batch(batch);
  const gemm_shape s = resolve(shape).s;
  const bool ta = s.trans_a == transpose::yes, tb = s.trans_b == transpose::yes;
  for (std::int64_t batch_i = 0; batch_i < batch.count; ++batch_i) {
    const float* ab = a + batch_i * batch.stride_a;
    const float* bb = b + batch_i * batch.stride_b;
    float* cb = c + batch_i * batch.stride_c;
    for (std::int64_t i = 0; i < s.m; ++i) {
      for (std::int64_t j = 0; j < s.n; ++j) {
        double acc = 0.0;
        for (std::int64_t p = 0; p < s.k; ++p) {
          const double x = ta ? ab[p * s.lda + i] : ab[i * s.lda + p];
          const double y = tb ? bb[j * s.ldb + p] : bb[p * s.ldb + j];
          acc += x * y;
        }
        float& out = cb[i * s.ldc + j];
        const double old = s.beta == 0.0f ? 0.0 : static_cast<double>(s.beta) * out;
        out = static_cast<float>(static_cast<double>(s.alpha) * acc + old);
      }
    }
  }
}

} // namespace dsa::cpu
