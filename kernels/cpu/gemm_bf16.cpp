// bf16 GEMM through oneDNN's matmul; see gemm_bf16.hpp.
#include "kernels/cpu/gemm_bf16.hpp"

#include "core/error.hpp"
#include "kernels/cpu/convert.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <vector>

#ifdef DSA_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace dsa::cpu {
namespace {

std::atomic<bool> operands_bf16{false};

#ifdef DSA_HAVE_DNNL
using dnnl::memory;

// One matmul per distinct shape and thread: creating a primitive costs far more than a
// small product, so each thread keeps the ones it made (primitives are not shared between
// threads here, so no lock is needed).
struct cached_matmul {
  dnnl::matmul prim;
  memory::desc a, b, c;
};

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine = [] {
    // Each thread keeps the primitives it made (matmul_for), so oneDNN's own process-wide
    // cache of them is a second copy: with it, a bf16 quick start measured ~45 MiB more
    // peak resident memory (353-407 MiB against 305-309 without).
    dnnl::set_primitive_cache_capacity(0);
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return engine;
}

// dims and strides of a (batch, rows, cols) operand: op(X) is (rows, cols); stored transposed
// when trans, with row stride ld; batch entries `stride` apart (0: one entry broadcast).
memory::desc operand_desc(memory::data_type type, std::int64_t count, std::int64_t stride, std::int64_t rows,
                          std::int64_t cols, bool trans, std::int64_t ld) {
  const memory::dim batch = stride == 0 ? 1 : count;
  const memory::dims dims{batch, rows, cols};
  // oneDNN wants each batch entry to span whole rows: stride >= stored rows x ld.
  const memory::dims strides{stride == 0 ? (trans ? cols : rows) * ld : stride, trans ? 1 : ld, trans ? ld : 1};
  return memory::desc(dims, type, strides);
}

cached_matmul& matmul_for(const gemm_shape& s, const gemm_batch& batch) {
  thread_local std::map<std::vector<std::int64_t>, cached_matmul> cache;
  std::uint32_t alpha_bits = 0, beta_bits = 0;
  std::memcpy(&alpha_bits, &s.alpha, 4);
  std::memcpy(&beta_bits, &s.beta, 4);
  const std::vector<std::int64_t> key{s.m, s.n, s.k, s.trans_a == transpose::yes, s.trans_b == transpose::yes,
                                      s.lda, s.ldb, s.ldc, batch.count, batch.stride_a, batch.stride_b,
                                      batch.stride_c, alpha_bits, beta_bits};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  cached_matmul m;
  m.a = operand_desc(memory::data_type::bf16, batch.count, batch.stride_a, s.m, s.k, s.trans_a == transpose::yes, s.lda);
  m.b = operand_desc(memory::data_type::bf16, batch.count, batch.stride_b, s.k, s.n, s.trans_b == transpose::yes, s.ldb);
  m.c = operand_desc(memory::data_type::f32, batch.count, batch.stride_c, s.m, s.n, false, s.ldc);
  dnnl::primitive_attr attr;
  if (s.alpha != 1.0f) attr.set_output_scales(0, {s.alpha});
  if (s.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(s.beta);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(m.a, m.b, m.c), attr, cpu_engine());
  m.prim = dnnl::matmul(pd);
  return cache.emplace(key, std::move(m)).first->second;
}

// One call for the whole batch. Entries whose C overlap (stride_c 0 or less than a block)
// cannot be one oneDNN call: the caller runs those one at a time.
void run_matmul(float* c, const std::uint16_t* a, const std::uint16_t* b, const gemm_shape& s, const gemm_batch& batch) {
  cached_matmul& m = matmul_for(s, batch);
  thread_local dnnl::stream stream(cpu_engine());
  memory am(m.a, cpu_engine(), const_cast<std::uint16_t*>(a));
  memory bm(m.b, cpu_engine(), const_cast<std::uint16_t*>(b));
  memory cm(m.c, cpu_engine(), c);
  m.prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  stream.wait();
}
#endif

bool cpu_has_bf16_instructions() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
}

} // namespace

bool bf16_gemm_supported(std::string* why) {
#ifdef DSA_HAVE_DNNL
  // AMX-BF16 CPUs all have AVX512_BF16, so one flag covers both.
  static const bool has = cpu_has_bf16_instructions();
  if (!has && why) *why = "this CPU has neither AVX512_BF16 nor AMX";
  return has;
#else
  if (why) *why = "this build has no oneDNN (libdnnl-dev)";
  return false;
#endif
}

std::string bf16_gemm_implementation() {
#ifdef DSA_HAVE_DNNL
  if (!bf16_gemm_supported()) return {};
  gemm_shape s{1024, 256, 256};
  s = resolve_gemm_shape(s);
  const memory::desc a = operand_desc(memory::data_type::bf16, 1, 0, s.m, s.k, false, s.lda);
  const memory::desc b = operand_desc(memory::data_type::bf16, 1, 0, s.k, s.n, false, s.ldb);
  const memory::desc c = operand_desc(memory::data_type::f32, 1, 0, s.m, s.n, false, s.ldc);
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), cpu_engine()).impl_info_str();
#else
  return {};
#endif
}

void gemm_bf16(float* c, const std::uint16_t* a, const std::uint16_t* b, const gemm_shape& shape,
               const gemm_batch& batch) {
  std::string why;
  DSA_CHECK(bf16_gemm_supported(&why), "gemm_bf16: {}", why);
  DSA_CHECK(batch.count >= 0 && batch.stride_a >= 0 && batch.stride_b >= 0 && batch.stride_c >= 0,
            "gemm_bf16: batch of {} with strides a={} b={} c={}", batch.count, batch.stride_a, batch.stride_b,
            batch.stride_c);
  const gemm_shape s = resolve_gemm_shape(shape);
  if (s.m == 0 || s.n == 0 || batch.count == 0) return;
  if (s.k == 0) {
    for (std::int64_t e = 0; e < batch.count; ++e) gemm_scale_c(c + e * batch.stride_c, s);
    return;
  }
#ifdef DSA_HAVE_DNNL
  if (batch.count == 1) return run_matmul(c, a, b, s, batch);
  // oneDNN takes a batch whose entries lie apart. Entries that interleave (attention's heads
  // as column blocks of the same rows) are copied apart first, and C's copied back row by
  // row; entries whose C blocks overlap (stride 0) accumulate in order, one call each.
  // What oneDNN counts as an entry's span: its stored rows times the row stride.
  const std::int64_t ext_a = (s.trans_a == transpose::yes ? s.k : s.m) * s.lda;
  const std::int64_t ext_b = (s.trans_b == transpose::yes ? s.n : s.k) * s.ldb;
  const std::int64_t ext_c = s.m * s.ldc;
  if (!gemm_c_disjoint(s, batch)) {
    for (std::int64_t e = 0; e < batch.count; ++e)
      run_matmul(c + e * batch.stride_c, a + e * batch.stride_a, b + e * batch.stride_b, s, {});
    return;
  }
  gemm_batch packed = batch;
  thread_local std::vector<std::uint16_t> a_apart, b_apart;
  thread_local std::vector<float> c_apart;
  // Copies entries `stride` apart to `ext` apart; `used` elements of each are read.
  auto apart = [&](const std::uint16_t* x, std::int64_t stride, std::int64_t ext, std::int64_t used,
                   std::vector<std::uint16_t>& buf, std::int64_t& new_stride) -> const std::uint16_t* {
    if (stride == 0 || stride >= ext) return x;
    buf.resize(static_cast<std::size_t>(batch.count * ext));
    for (std::int64_t e = 0; e < batch.count; ++e)
      std::memcpy(buf.data() + e * ext, x + e * stride, static_cast<std::size_t>(used) * sizeof(std::uint16_t));
    new_stride = ext;
    return buf.data();
  };
  const std::uint16_t* pa = apart(a, batch.stride_a, ext_a, gemm_operand_extent(s, true), a_apart, packed.stride_a);
  const std::uint16_t* pb = apart(b, batch.stride_b, ext_b, gemm_operand_extent(s, false), b_apart, packed.stride_b);
  if (batch.stride_c >= ext_c) return run_matmul(c, pa, pb, s, packed);
  // Not cleared: the product writes every element of each entry's rows that is copied back,
  // and with beta != 0 those are copied in first; row padding is never read.
  c_apart.resize(static_cast<std::size_t>(batch.count * ext_c));
  auto rows = [&](bool in) {
    for (std::int64_t e = 0; e < batch.count; ++e)
      for (std::int64_t i = 0; i < s.m; ++i) {
        float* shared = c + e * batch.stride_c + i * s.ldc;
        float* own = c_apart.data() + e * ext_c + i * s.ldc;
        std::memcpy(in ? own : shared, in ? shared : own, static_cast<std::size_t>(s.n) * sizeof(float));
      }
  };
  if (s.beta != 0.0f) rows(true);
  packed.stride_c = ext_c;
  run_matmul(c_apart.data(), pa, pb, s, packed);
  rows(false);
#endif
}

void set_bf16_operands(bool on) {
  std::string why;
  DSA_CHECK(!on || bf16_gemm_supported(&why), "bf16 GEMM operands: {}", why);
  operands_bf16.store(on, std::memory_order_relaxed);
}

bool bf16_operands() { return operands_bf16.load(std::memory_order_relaxed); }

} // namespace dsa::cpu
