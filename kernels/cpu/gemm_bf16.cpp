// bf16 GEMM through oneDNN's matmul; see gemm_bf16.hpp.
#include "kernels/cpu/gemm_bf16.hpp"

#include "core/error.hpp"
#include "kernels/cpu/convert.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <unordered_map>
#include <vector>

#ifdef DSA_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace dsa::cpu {
namespace {

std::atomic<bool> operands_bf16{false};

#ifdef DSA_HAVE_DNNL
using dnnl::memory;

// One matmul per thread and distinct key, kept by the thread that made it (creating a
// primitive costs far more than a small product; not shared, so no lock). With fixed shapes
// the key is the whole shape; with shapes at run time only the transposes, alpha and beta, so the masked-LM head's products, whose row count changes with
// every micro-batch, do not make a primitive (about 170 KiB resident each) per row count.
struct cached_matmul {
  dnnl::matmul prim;
};

// What one thread keeps: a thread that meets more shapes than this (fixed shapes, a head's
// row counts, evaluation batches) starts over rather than growing without end. Bound calls
// hold their primitive too, so at most twice this many primitives stay alive per thread.
constexpr std::size_t max_kept = 256;

// Not AMX, unless ONEDNN_MAX_CPU_ISA asks for it: Debian 12's oneDNN (2.6.3) computed wrong
// products with AMX's fixed-shape brgemm on 2 threads (a small BERT step's loss 5.66 for
// 5.42 on a 2-core AMX Xeon; right with 1 thread or without AMX), so its AVX512_BF16
// kernels run there, as on CPUs without AMX. oneDNN takes the limit only before its first
// ISA query, so every entry point calls this first.
void limit_onednn_isa() {
  static const bool limited = [] {
    const char* asked = std::getenv("ONEDNN_MAX_CPU_ISA");
    if (asked && *asked) return false;
    const auto st = dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx512_core_bf16);
    DSA_CHECK(st == dnnl::status::success, "gemm_bf16: oneDNN refused its ISA limit (queried before it was set)");
    return true;
  }();
  (void)limited;
}

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine = [] {
    limit_onednn_isa();
    // Each thread keeps the primitives it made (matmul_for), so oneDNN's own process-wide
    // cache of them is a second copy: with it, a bf16 quick start measured ~45 MiB more
    // peak resident memory (353-407 MiB against 305-309 without).
    dnnl::set_primitive_cache_capacity(0);
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return engine;
}

// -1: not chosen yet (default_runtime_shapes()), else 0 fixed, 1 at run time.
std::atomic<int> shapes_choice{-1};

// At run time where oneDNN has no AMX kernels: its shape-agnostic gemm:jit then measured as
// fast as or faster than the fixed-shape brgemm on AVX512_BF16 (bench kernels prints both).
// AMX tiles are reached only through brgemm, which takes fixed shapes.
bool default_runtime_shapes() {
  // cpu_isa values are feature bit masks (not ordered): AMX is in use when the effective
  // ISA has every bit of avx512_core_amx (ONEDNN_MAX_CPU_ISA may hold it below).
  limit_onednn_isa();
  const auto amx = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_amx);
  return (static_cast<unsigned>(dnnl::get_effective_cpu_isa()) & amx) != amx;
}

bool runtime_shapes() {
  int v = shapes_choice.load(std::memory_order_relaxed);
  if (v < 0) {
    v = default_runtime_shapes() ? 1 : 0;
    shapes_choice.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

// dims and strides of a (batch, rows, cols) operand: op(X) is (rows, cols); stored transposed
// when trans, with row stride ld; batch entries `stride` apart (0: one entry broadcast).
// With `group_count` (gemm_bf16_groups), (groups, batch, rows, cols), groups `group_stride` apart.
memory::desc operand_desc(memory::data_type type, std::int64_t count, std::int64_t stride, std::int64_t rows,
                          std::int64_t cols, bool trans, std::int64_t ld, std::int64_t group_count = 0,
                          std::int64_t group_stride = 0) {
  const memory::dim batch = stride == 0 ? 1 : count;
  // oneDNN wants each batch entry to span whole rows: stride >= stored rows x ld.
  const memory::dim entry_stride = stride == 0 ? (trans ? cols : rows) * ld : stride;
  if (group_count > 0)
    return memory::desc({group_count, batch, rows, cols}, type,
                        {group_stride, entry_stride, trans ? 1 : ld, trans ? ld : 1});
  return memory::desc({batch, rows, cols}, type, {entry_stride, trans ? 1 : ld, trans ? ld : 1});
}

// The same with every size and stride left to run time; 4 dimensions for groups.
memory::desc runtime_desc(memory::data_type type, bool trans, bool grouped = false) {
  const memory::dim r = DNNL_RUNTIME_DIM_VAL;
  if (grouped) return memory::desc({r, r, r, r}, type, {r, r, trans ? 1 : r, trans ? r : 1});
  return memory::desc({r, r, r}, type, {r, trans ? 1 : r, trans ? r : 1});
}

struct operand_descs {
  memory::desc a, b, c;
};

// Without groups (nullptr) 3 dimensions, with them 4.
operand_descs descs_of(const gemm_shape& s, const gemm_batch& batch, const gemm_groups* groups = nullptr) {
  const gemm_groups g = groups ? *groups : gemm_groups{0, 0, 0, 0};
  return {operand_desc(memory::data_type::bf16, batch.count, batch.stride_a, s.m, s.k, s.trans_a == transpose::yes,
                       s.lda, g.count, g.stride_a),
          operand_desc(memory::data_type::bf16, batch.count, batch.stride_b, s.k, s.n, s.trans_b == transpose::yes,
                       s.ldb, g.count, g.stride_b),
          operand_desc(memory::data_type::f32, batch.count, batch.stride_c, s.m, s.n, false, s.ldc, g.count,
                       g.stride_c)};
}

std::map<std::vector<std::int64_t>, cached_matmul>& primitives_of_this_thread() {
  thread_local std::map<std::vector<std::int64_t>, cached_matmul> cache;
  return cache;
}

cached_matmul& matmul_for(const gemm_shape& s, const gemm_batch& batch, bool runtime, const gemm_groups* groups) {
  auto& cache = primitives_of_this_thread();
  std::uint32_t alpha_bits = 0, beta_bits = 0;
  std::memcpy(&alpha_bits, &s.alpha, 4);
  std::memcpy(&beta_bits, &s.beta, 4);
  const bool ta = s.trans_a == transpose::yes, tb = s.trans_b == transpose::yes;
  const std::vector<std::int64_t> key =
      runtime ? std::vector<std::int64_t>{groups ? -2 : -1, ta, tb, alpha_bits, beta_bits}
              : std::vector<std::int64_t>{s.m, s.n, s.k, ta, tb, s.lda, s.ldb, s.ldc, batch.count, batch.stride_a,
                                          batch.stride_b, batch.stride_c, alpha_bits, beta_bits};
  DSA_CHECK(groups == nullptr || runtime, "gemm_bf16: groups are made with shapes at run time only");
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= max_kept) cache.clear();
  cached_matmul m;
  operand_descs d;
  if (runtime) {
    d = {runtime_desc(memory::data_type::bf16, ta, groups), runtime_desc(memory::data_type::bf16, tb, groups),
         runtime_desc(memory::data_type::f32, false, groups)};
  } else {
    d = descs_of(s, batch);
  }
  dnnl::primitive_attr attr;
  if (s.alpha != 1.0f) attr.set_output_scales(0, {s.alpha});
  if (s.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(s.beta);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(d.a, d.b, d.c), attr, cpu_engine());
  m.prim = dnnl::matmul(pd);
  return cache.emplace(key, std::move(m)).first->second;
}

// A product as called: its primitive with the operands' memory objects and the argument map
// made once, so a repeated call only sets the three data pointers. Made per call before,
// that was about 50 small mallocs and a few oneDNN object creations per product, ~12k mallocs
// per BERT-mini micro-batch of 8, where fp32 made none.
struct bound_matmul {
  bool describable = false; // oneDNN accepts the layout (else nothing below is set)
  dnnl::matmul prim;
  memory a, b, c;
  std::unordered_map<int, memory> args;
};

// The whole call: shapes, strides, batch, groups, alpha, beta and how the primitive is keyed.
using call_key = std::array<std::int64_t, 19>;

std::map<call_key, bound_matmul>& calls_of_this_thread() {
  thread_local std::map<call_key, bound_matmul> calls;
  return calls;
}

// groups: nullptr for a 3-dimensional call (gemm_bf16), else gemm_bf16_groups' (runtime only).
bound_matmul& bound_for(const gemm_shape& s, const gemm_batch& batch, bool runtime,
                        const gemm_groups* groups = nullptr) {
  auto& calls = calls_of_this_thread();
  std::uint32_t alpha_bits = 0, beta_bits = 0;
  std::memcpy(&alpha_bits, &s.alpha, 4);
  std::memcpy(&beta_bits, &s.beta, 4);
  const gemm_groups g = groups ? *groups : gemm_groups{0, 0, 0, 0};
  const call_key key{runtime ? 1 : 0, s.m,        s.n,        s.k,        s.trans_a == transpose::yes,
                     s.trans_b == transpose::yes, s.lda,      s.ldb,      s.ldc,
                     batch.count,     batch.stride_a, batch.stride_b, batch.stride_c,
                     g.count,         g.stride_a, g.stride_b, g.stride_c, alpha_bits,
                     beta_bits};
  auto it = calls.find(key);
  if (it != calls.end()) return it->second;
  if (calls.size() >= max_kept) calls.clear();
  bound_matmul b;
  operand_descs d;
  try {
    d = descs_of(s, batch, groups);
    b.describable = true;
  } catch (const dnnl::error&) {
    return calls.emplace(key, std::move(b)).first->second;
  }
  b.prim = matmul_for(s, batch, runtime, groups).prim;
  b.a = memory(d.a, cpu_engine(), DNNL_MEMORY_NONE);
  b.b = memory(d.b, cpu_engine(), DNNL_MEMORY_NONE);
  b.c = memory(d.c, cpu_engine(), DNNL_MEMORY_NONE);
  b.args = {{DNNL_ARG_SRC, b.a}, {DNNL_ARG_WEIGHTS, b.b}, {DNNL_ARG_DST, b.c}};
  return calls.emplace(key, std::move(b)).first->second;
}

bool describable(const gemm_shape& s, const gemm_batch& batch, bool runtime, const gemm_groups* groups = nullptr) {
  return bound_for(s, batch, runtime, groups).describable;
}

// One call for the whole batch. Entries whose C overlap (stride_c 0 or less than a block)
// cannot be one oneDNN call: the caller runs those one at a time.
// shapes_at_run_time: the keying gemm_bf16 read once for the whole call.
void run_matmul(float* c, const std::uint16_t* a, const std::uint16_t* b, const gemm_shape& s, const gemm_batch& batch,
                bool shapes_at_run_time, const gemm_groups* groups = nullptr) {
  // oneDNN refuses a broadcast batch operand with sizes at run time: fixed shapes for those.
  const bool broadcast = batch.count > 1 && (batch.stride_a == 0 || batch.stride_b == 0);
  const bool runtime = shapes_at_run_time && !broadcast;
  bound_matmul& m = bound_for(s, batch, runtime, groups);
  DSA_CHECK(m.describable, "gemm_bf16: oneDNN cannot describe a {}x{}x{} product with ld {}/{}/{} and {} entries",
            s.m, s.n, s.k, s.lda, s.ldb, s.ldc, batch.count);
  thread_local dnnl::stream stream(cpu_engine());
  m.a.set_data_handle(const_cast<std::uint16_t*>(a));
  m.b.set_data_handle(const_cast<std::uint16_t*>(b));
  m.c.set_data_handle(c);
  m.prim.execute(stream, m.args);
  stream.wait();
}
#endif

} // namespace

bool bf16_gemm_supported(std::string* why) {
#ifdef DSA_HAVE_DNNL
  // AMX-BF16 CPUs all have AVX512_BF16, so one flag covers both.
  static const bool has = cpu_has_avx512_bf16();
  if (!has && why)
    *why = best_isa() != hardware_isa() ? "DSA_CPU_ISA hides this CPU's AVX-512 (and with it AVX512_BF16)"
                                        : "this CPU has neither AVX512_BF16 nor AMX";
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
  const bool runtime = runtime_shapes();
  const operand_descs d = runtime ? operand_descs{runtime_desc(memory::data_type::bf16, false),
                                                  runtime_desc(memory::data_type::bf16, false),
                                                  runtime_desc(memory::data_type::f32, false)}
                                  : descs_of(s, {});
  const std::string impl = dnnl::matmul::primitive_desc(dnnl::matmul::desc(d.a, d.b, d.c), cpu_engine()).impl_info_str();
  return impl + (runtime ? ", shapes at run time" : ", fixed shapes");
#else
  return {};
#endif
}

bool bf16_gemm_runtime_shapes() {
#ifdef DSA_HAVE_DNNL
  return runtime_shapes();
#else
  return false;
#endif
}

void set_bf16_gemm_runtime_shapes(bool on) {
#ifdef DSA_HAVE_DNNL
  shapes_choice.store(on ? 1 : 0, std::memory_order_relaxed);
#else
  (void)on;
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
  const bool runtime = runtime_shapes(); // read once: the benchmark may change it between calls
  if (batch.count == 1) return run_matmul(c, a, b, s, batch, runtime);
  // With fixed shapes oneDNN takes a batch whose entries lie apart. Entries that interleave (attention's heads
  // as column blocks of the same rows) are copied apart first, and C's copied back row by
  // row; entries whose C blocks overlap (stride 0) accumulate in order, one call each.
  // What oneDNN counts as an entry's span: its stored rows times the row stride.
  const std::int64_t ext_a = (s.trans_a == transpose::yes ? s.k : s.m) * s.lda;
  const std::int64_t ext_b = (s.trans_b == transpose::yes ? s.n : s.k) * s.ldb;
  const std::int64_t ext_c = s.m * s.ldc;
  if (!gemm_c_disjoint(s, batch)) {
    for (std::int64_t e = 0; e < batch.count; ++e)
      run_matmul(c + e * batch.stride_c, a + e * batch.stride_a, b + e * batch.stride_b, s, {}, runtime);
    return;
  }
  // With shapes at run time oneDNN takes interleaved entries (attention's heads) as they lie,
  // when their strides describe a layout it accepts (no entry's rows reaching into the next).
  if (runtime && batch.stride_a != 0 && batch.stride_b != 0 && describable(s, batch, runtime))
    return run_matmul(c, a, b, s, batch, runtime);
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
  if (batch.stride_c >= ext_c) return run_matmul(c, pa, pb, s, packed, runtime);
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
  run_matmul(c_apart.data(), pa, pb, s, packed, runtime);
  rows(false);
#endif
}

bool gemm_bf16_groups_accepted(const gemm_shape& shape, const gemm_batch& batch, const gemm_groups& groups) {
  DSA_CHECK(batch.count >= 0 && batch.stride_a >= 0 && batch.stride_b >= 0 && batch.stride_c >= 0 &&
                groups.count >= 0 && groups.stride_a >= 0 && groups.stride_b >= 0 && groups.stride_c >= 0,
            "gemm_bf16_groups: {} groups (strides a={} b={} c={}) of {} entries (strides a={} b={} c={})", groups.count,
            groups.stride_a, groups.stride_b, groups.stride_c, batch.count, batch.stride_a, batch.stride_b,
            batch.stride_c);
#ifdef DSA_HAVE_DNNL
  if (!bf16_gemm_supported()) return false;
  const gemm_shape s = resolve_gemm_shape(shape);
  if (!runtime_shapes() || s.m == 0 || s.n == 0 || s.k == 0 || batch.count == 0 || groups.count == 0) return false;
  // No operand shared by entries or groups (oneDNN refuses a broadcast with sizes at run time),
  // and every C element written once: each group's entries apart, and the groups apart.
  const bool shared = (batch.count > 1 && (batch.stride_a == 0 || batch.stride_b == 0)) ||
                      (groups.count > 1 && (groups.stride_a == 0 || groups.stride_b == 0));
  const std::int64_t group_c_extent = (batch.count - 1) * batch.stride_c + (s.m - 1) * s.ldc + s.n;
  if (shared || !gemm_c_disjoint(s, batch) || (groups.count > 1 && groups.stride_c < group_c_extent)) return false;
  return describable(s, batch, true, &groups);
#else
  (void)shape;
  return false;
#endif
}

bool gemm_bf16_groups(float* c, const std::uint16_t* a, const std::uint16_t* b, const gemm_shape& shape,
                      const gemm_batch& batch, const gemm_groups& groups) {
  std::string why;
  DSA_CHECK(bf16_gemm_supported(&why), "gemm_bf16_groups: {}", why);
  if (!gemm_bf16_groups_accepted(shape, batch, groups)) return false;
#ifdef DSA_HAVE_DNNL
  run_matmul(c, a, b, resolve_gemm_shape(shape), batch, true, &groups);
  return true;
#else
  (void)c, (void)a, (void)b;
  return false;
#endif
}

void set_bf16_operands(bool on) {
  std::string why;
  DSA_CHECK(!on || bf16_gemm_supported(&why), "bf16 GEMM operands: {}", why);
  operands_bf16.store(on, std::memory_order_relaxed);
}

bool bf16_operands() { return operands_bf16.load(std::memory_order_relaxed); }

bf16_gemm_kept bf16_gemm_kept_by_this_thread() {
#ifdef DSA_HAVE_DNNL
  return {primitives_of_this_thread().size(), calls_of_this_thread().size(), max_kept};
#else
  return {};
#endif
}

} // namespace dsa::cpu
