// cuBLASLt behind the CPU GEMM's row-major conventions. A row-major C(m, n) is the
// column-major C^T(n, m) = op(B)^T op(A)^T, so every call runs as a column-major product
// with A and B swapped: cuBLASLt's "A" is our B and its "B" our A, and no data moves.
#include "kernels/cuda/gemm.hpp"

#include <cublasLt.h>
#include <dlfcn.h>

#include <map>
#include <mutex>
#include <tuple>
#include <vector>

namespace dsa::cuda {
namespace {

// The cuBLASLt entry points we use, resolved once from the shared library.
struct lt_api {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtGetStatusString) status_string = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatrixLayoutSetAttribute) layout_set = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
};

template <class F> bool resolve(void* lib, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

// Loads libcublasLt once per process; the library stays loaded until exit.
expected<const lt_api*> load_api() {
  static std::once_flag once;
  static lt_api api;
  static std::string failure;
  std::call_once(once, [] {
    void* lib = dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      failure = fmt::format("cannot load cuBLASLt (libcublasLt.so.13): {}", why ? why : "unknown");
      return;
    }
    const bool ok = resolve(lib, api.create, "cublasLtCreate") &&
                    resolve(lib, api.destroy, "cublasLtDestroy") &&
                    resolve(lib, api.status_string, "cublasLtGetStatusString") &&
                    resolve(lib, api.desc_create, "cublasLtMatmulDescCreate") &&
                    resolve(lib, api.desc_destroy, "cublasLtMatmulDescDestroy") &&
                    resolve(lib, api.desc_set, "cublasLtMatmulDescSetAttribute") &&
                    resolve(lib, api.layout_create, "cublasLtMatrixLayoutCreate") &&
                    resolve(lib, api.layout_destroy, "cublasLtMatrixLayoutDestroy") &&
                    resolve(lib, api.layout_set, "cublasLtMatrixLayoutSetAttribute") &&
                    resolve(lib, api.pref_create, "cublasLtMatmulPreferenceCreate") &&
                    resolve(lib, api.pref_destroy, "cublasLtMatmulPreferenceDestroy") &&
                    resolve(lib, api.pref_set, "cublasLtMatmulPreferenceSetAttribute") &&
                    resolve(lib, api.heuristic, "cublasLtMatmulAlgoGetHeuristic") &&
                    resolve(lib, api.matmul, "cublasLtMatmul");
    if (!ok)
      failure = "libcublasLt.so.13 lacks a cuBLASLt entry point this build uses";
  });
  if (!failure.empty())
    return make_error(errc::unsupported, "{}", failure);
  return &api;
}

cudaDataType_t data_type(elem e) {
  switch (e) {
  case elem::f32: return CUDA_R_32F;
  case elem::f16: return CUDA_R_16F;
  case elem::bf16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

const char* elem_name(elem e) {
  switch (e) {
  case elem::f32: return "f32";
  case elem::f16: return "f16";
  case elem::bf16: return "bf16";
  }
  return "?";
}

// Largest power of two (at most 256) dividing the address: cuBLASLt picks algorithms for the
// alignment it is told, so a plan is made per alignment class.
std::uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && v % a != 0)
    a /= 2;
  return a;
}

// Everything a plan depends on.
using plan_key = std::tuple<std::int64_t, std::int64_t, std::int64_t, bool, bool, std::int64_t,
                            std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                            std::int64_t, int, int, int, int, std::uint32_t, std::uint32_t,
                            std::uint32_t, std::uint32_t>;

} // namespace

struct gemm_engine::impl {
  const lt_api* api = nullptr;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  bool deterministic = false; // no split-K reduction schemes

  struct plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<plan_key, plan> plans;

  ~impl() {
    for (auto& entry : plans)
      release(entry.second);
    if (handle)
      api->destroy(handle);
    if (workspace)
      cudaFree(workspace);
  }

  void release(plan& p) const {
    if (p.desc)
      api->desc_destroy(p.desc);
    for (cublasLtMatrixLayout_t l : {p.a, p.b, p.c})
      if (l)
        api->layout_destroy(l);
  }

  error lt_error(const char* what, cublasStatus_t s) const {
    return make_error(errc::runtime, "cuBLASLt {} failed: {}", what, api->status_string(s));
  }

  expected<cublasLtMatrixLayout_t> layout(elem type, std::int64_t rows, std::int64_t cols,
                                          std::int64_t ld, const cpu::gemm_batch& batch,
                                          std::int64_t stride) const {
    cublasLtMatrixLayout_t l = nullptr;
    cublasStatus_t s = api->layout_create(&l, data_type(type), static_cast<std::uint64_t>(rows),
                                          static_cast<std::uint64_t>(cols), ld);
    if (s != CUBLAS_STATUS_SUCCESS)
      return lt_error("matrix layout", s);
    if (batch.count > 1) {
      const auto count = static_cast<std::int32_t>(batch.count);
      s = api->layout_set(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
      if (s == CUBLAS_STATUS_SUCCESS)
        s = api->layout_set(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                            sizeof stride);
      if (s != CUBLAS_STATUS_SUCCESS) {
        api->layout_destroy(l);
        return lt_error("batched layout", s);
      }
    }
    return l;
  }

  // Descriptors and the heuristic's first algorithm for one call shape.
  expected<plan> make_plan(const gemm_call& call, const cpu::gemm_shape& s) {
    plan p;
    auto fail = [&](error e) {
      release(p);
      return e;
    };
    cublasStatus_t st = api->desc_create(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st != CUBLAS_STATUS_SUCCESS)
      return lt_error("matmul descriptor", st);
    // cuBLASLt's A is our B and its B our A (see the top of this file).
    const cublasOperation_t op_a = s.trans_b == cpu::transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = s.trans_a == cpu::transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
    st = api->desc_set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = api->desc_set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b);
    if (st == CUBLAS_STATUS_SUCCESS && call.epilogue == gemm_epilogue::bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      const auto bias_type = static_cast<std::int32_t>(data_type(call.bias_type));
      st = api->desc_set(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
      if (st == CUBLAS_STATUS_SUCCESS)
        st = api->desc_set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                           sizeof bias_type);
      if (st == CUBLAS_STATUS_SUCCESS)
        st = api->desc_set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias,
                           sizeof call.bias);
    }
    if (st != CUBLAS_STATUS_SUCCESS)
      return fail(lt_error("matmul attributes", st));
    const bool ta = s.trans_a == cpu::transpose::yes, tb = s.trans_b == cpu::transpose::yes;
    // Our B stored row-major (rows_b, cols_b) is column-major (cols_b, rows_b); likewise A.
    auto la = layout(call.ab_type, tb ? s.k : s.n, tb ? s.n : s.k, s.ldb, call.batch,
                     call.batch.stride_b);
    if (!la)
      return fail(la.err());
    p.a = la.value();
    auto lb = layout(call.ab_type, ta ? s.m : s.k, ta ? s.k : s.m, s.lda, call.batch,
                     call.batch.stride_a);
    if (!lb)
      return fail(lb.err());
    p.b = lb.value();
    auto lc = layout(call.c_type, s.n, s.m, s.ldc, call.batch, call.batch.stride_c);
    if (!lc)
      return fail(lc.err());
    p.c = lc.value();

    cublasLtMatmulPreference_t pref = nullptr;
    st = api->pref_create(&pref);
    if (st != CUBLAS_STATUS_SUCCESS)
      return fail(lt_error("preference", st));
    const std::uint64_t ws = workspace_bytes;
    const std::uint32_t align_a = alignment(call.b), align_b = alignment(call.a),
                        align_c = alignment(call.c);
    st = api->pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = api->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                         sizeof align_a);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = api->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                         sizeof align_b);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = api->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                         sizeof align_c);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = api->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                         sizeof align_c);
    if (st == CUBLAS_STATUS_SUCCESS && deterministic) {
      // Only algorithms that reduce over k in one pass (CUBLASLT_REDUCTION_SCHEME_NONE).
      const std::uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE;
      st = api->pref_set(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes);
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
      st = api->heuristic(handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    api->pref_destroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0)
      return fail(make_error(errc::unsupported,
                             "cuBLASLt has no algorithm for a {}x{}x{} GEMM of {} operands into "
                             "{} (transposes {}{}, batch {}, epilogue {}): {}",
                             s.m, s.n, s.k, elem_name(call.ab_type), elem_name(call.c_type),
                             ta ? 'T' : 'N', tb ? 'T' : 'N', call.batch.count,
                             call.epilogue == gemm_epilogue::bias ? "bias" : "none",
                             st != CUBLAS_STATUS_SUCCESS ? api->status_string(st)
                                                         : "no candidate"));
    p.algo = result.algo;
    return p;
  }
};

gemm_engine::gemm_engine(std::unique_ptr<impl> state) : impl_(std::move(state)) {}
gemm_engine::~gemm_engine() = default;

expected<std::unique_ptr<gemm_engine>> gemm_engine::open(std::size_t workspace_bytes, bool deterministic) {
  auto api = load_api();
  if (!api)
    return api.err();
  auto state = std::make_unique<impl>();
  state->api = api.value();
  const cublasStatus_t s = state->api->create(&state->handle);
  if (s != CUBLAS_STATUS_SUCCESS)
    return make_error(errc::unsupported, "cublasLtCreate failed: {}",
                      state->api->status_string(s));
  if (workspace_bytes > 0) {
    const cudaError_t e = cudaMalloc(&state->workspace, workspace_bytes);
    if (e != cudaSuccess)
      return make_error(errc::runtime, "cannot allocate the {}-byte cuBLASLt workspace: {}",
                        workspace_bytes, cudaGetErrorString(e));
  }
  state->workspace_bytes = workspace_bytes;
  state->deterministic = deterministic;
  return std::unique_ptr<gemm_engine>(new gemm_engine(std::move(state)));
}

std::size_t gemm_engine::plan_count() const { return impl_->plans.size(); }

status gemm_engine::run(const gemm_call& call, cudaStream_t stream) {
  cpu::gemm_shape s = call.shape;
  if (s.m < 0 || s.n < 0 || s.k < 0)
    return make_error(errc::invalid_argument, "gemm: negative size m={} n={} k={}", s.m, s.n, s.k);
  const bool ta = s.trans_a == cpu::transpose::yes, tb = s.trans_b == cpu::transpose::yes;
  const std::int64_t cols_a = ta ? s.m : s.k, cols_b = tb ? s.k : s.n;
  s.lda = s.lda == 0 ? cols_a : s.lda;
  s.ldb = s.ldb == 0 ? cols_b : s.ldb;
  s.ldc = s.ldc == 0 ? s.n : s.ldc;
  if (s.lda < cols_a || s.ldb < cols_b || s.ldc < s.n)
    return make_error(errc::invalid_argument,
                      "gemm: leading dimensions lda={} ldb={} ldc={} below the rows' {}, {}, {} "
                      "columns",
                      s.lda, s.ldb, s.ldc, cols_a, cols_b, s.n);
  if (call.batch.count < 1 || call.batch.count > 2147483647LL || call.batch.stride_a < 0 ||
      call.batch.stride_b < 0 || call.batch.stride_c < 0)
    return make_error(errc::invalid_argument, "gemm: batch count {} or a stride is out of range",
                      call.batch.count);
  if (call.c_type != elem::f32 && call.c_type != call.ab_type)
    return make_error(errc::invalid_argument,
                      "gemm: a {} output needs {} operands (got {}); f32 takes any operands",
                      elem_name(call.c_type), elem_name(call.c_type), elem_name(call.ab_type));
  if (call.epilogue == gemm_epilogue::bias && !call.bias)
    return make_error(errc::invalid_argument, "gemm: the bias epilogue needs a bias");
  if (call.epilogue == gemm_epilogue::bias && call.bias_type != call.c_type)
    return make_error(errc::invalid_argument,
                      "gemm: a {} bias into a {} output: cuBLASLt takes a bias of the output's "
                      "type (cuda::bias_add adds an f32 bias to a half output)",
                      elem_name(call.bias_type), elem_name(call.c_type));
  if (s.m == 0 || s.n == 0)
    return {};
  if (!call.c || ((!call.a || !call.b) && s.k > 0))
    return make_error(errc::invalid_argument, "gemm: a null operand or output");
  if (s.k == 0) {
    // No product: C = beta * C, which cuBLASLt does not take; only beta 0 or 1 are needed.
    if (call.epilogue != gemm_epilogue::none || (s.beta != 0.0f && s.beta != 1.0f))
      return make_error(errc::invalid_argument,
                        "gemm: k = 0 supports beta 0 or 1 without an epilogue");
    if (s.beta == 1.0f)
      return {};
    const auto es = static_cast<std::size_t>(elem_size(call.c_type));
    for (std::int64_t i = 0; i < call.batch.count; ++i) {
      char* c = static_cast<char*>(call.c) + static_cast<std::size_t>(i * call.batch.stride_c) * es;
      const cudaError_t e =
          cudaMemset2DAsync(c, static_cast<std::size_t>(s.ldc) * es, 0,
                            static_cast<std::size_t>(s.n) * es, static_cast<std::size_t>(s.m), stream);
      if (e != cudaSuccess)
        return make_error(errc::runtime, "gemm: clearing C failed: {}", cudaGetErrorString(e));
    }
    return {};
  }

  const plan_key key{s.m, s.n, s.k, ta, tb, s.lda, s.ldb, s.ldc, call.batch.count,
                     call.batch.stride_a, call.batch.stride_b, call.batch.stride_c,
                     static_cast<int>(call.ab_type), static_cast<int>(call.c_type),
                     static_cast<int>(call.epilogue), static_cast<int>(call.bias_type),
                     alignment(call.a), alignment(call.b), alignment(call.c),
                     call.epilogue == gemm_epilogue::bias ? alignment(call.bias) : 0u};
  auto found = impl_->plans.find(key);
  if (found == impl_->plans.end()) {
    auto made = impl_->make_plan(call, s);
    if (!made)
      return made.err();
    found = impl_->plans.emplace(key, made.value()).first;
  }
  impl::plan& p = found->second;
  if (call.epilogue == gemm_epilogue::bias) {
    const cublasStatus_t st =
        impl_->api->desc_set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias, sizeof call.bias);
    if (st != CUBLAS_STATUS_SUCCESS)
      return impl_->lt_error("setting the bias", st);
  }
  const float alpha = s.alpha, beta = s.beta;
  const cublasStatus_t st = impl_->api->matmul(
      impl_->handle, p.desc, &alpha, call.b, p.a, call.a, p.b, &beta, call.c, p.c, call.c, p.c,
      &p.algo, impl_->workspace, impl_->workspace_bytes, stream);
  if (st != CUBLAS_STATUS_SUCCESS)
    return impl_->lt_error("matmul", st);
  return {};
}

} // namespace dsa::cuda
