// bf16 GEMM with fp32 accumulation through oneDNN's matmul (libdnnl), which runs on AMX
// tiles or AVX512_BF16 dot products where the CPU has them. Debian 12's OpenBLAS (0.3.21) is
// built without sbgemm, so oneDNN is the library that reaches those instructions here.
//
// Operands are bf16 bit patterns, C is f32; the contract (shapes, transposes, leading
// dimensions, alpha, beta with 0 overwriting, batches) is cpu::gemm_batched's. Results are
// the fp32 sums of exact bf16 products: within fp32 accumulation error of gemm_ref on the
// widened operands (test_gemm_bf16), not bit for bit (oneDNN chooses its own summation order).
//
// bf16 operands mode: while set_bf16_operands(true) holds, cpu::gemm and cpu::gemm_batched
// round their f32 operands to bf16 (nearest even), take bf16 ones as they are, and run here, so a model computing in
// f32 gets bf16 matrix products without code of its own. Process-wide: a training run sets
// it for its duration (bf16.cpu_gemm), one run per process at a time.
#pragma once

#include "kernels/cpu/gemm.hpp"

#include <cstdint>
#include <string>

namespace dsa::cpu {

// Whether gemm_bf16 can run and is worth running: this build has oneDNN and the CPU has
// AVX512_BF16 or AMX. When not, `why` (if given) says which is missing.
bool bf16_gemm_supported(std::string* why = nullptr);
// The implementation oneDNN picks for a BERT-size product and how its primitives are keyed,
// e.g. "brg:avx512_core_amx_bf16, fixed shapes" or "gemm:jit, shapes at run time"; empty
// when unsupported.
std::string bf16_gemm_implementation();

// Primitives with every size and stride given at run time (one per transpose pair, alpha and
// beta) or one per fixed shape. Run time by default where oneDNN has no AMX kernels: its
// shape-agnostic gemm:jit was as fast as brgemm there, and a head whose row count changes
// with each micro-batch no longer makes a primitive per count. With AMX, fixed shapes (AMX
// is reached through brgemm only). Process-wide; bench kernels sets it to compare the two.
bool bf16_gemm_runtime_shapes();
void set_bf16_gemm_runtime_shapes(bool on);

// What the calling thread keeps for gemm_bf16: primitives (one per fixed shape, or per
// transpose pair, alpha and beta at run time) and bound calls (one per whole call), each
// up to `bound` (past it the thread starts over).
struct bf16_gemm_kept {
  std::size_t primitives = 0, calls = 0, bound = 0;
};
bf16_gemm_kept bf16_gemm_kept_by_this_thread();

// C (f32) = alpha op(A) op(B) + beta C with A and B bf16. A broken invariant when unsupported.
void gemm_bf16(float* c, const std::uint16_t* a, const std::uint16_t* b, const gemm_shape& shape,
               const gemm_batch& batch = {});

// gemm_bf16 over every group in one oneDNN call, its threads splitting the whole grid, where
// oneDNN takes the layout as it lies: shapes at run time (bf16_gemm_runtime_shapes), no operand
// shared (stride 0) by entries or groups, and no C element written twice. Otherwise false with
// nothing written: the caller runs the groups itself. Called outside a parallel region (inside
// one oneDNN runs on the calling thread alone). The same sums as one gemm_bf16 per group
// within fp32 accumulation (oneDNN may split the grid another way).
bool gemm_bf16_groups(float* c, const std::uint16_t* a, const std::uint16_t* b, const gemm_shape& shape,
                      const gemm_batch& batch, const gemm_groups& groups);
// Whether gemm_bf16_groups would take the layout (false where unsupported), so that a caller
// rounds its operands only for a call that runs.
bool gemm_bf16_groups_accepted(const gemm_shape& shape, const gemm_batch& batch, const gemm_groups& groups);

// The process-wide bf16 operands mode (above). Turning it on when unsupported is a broken
// invariant: callers check bf16_gemm_supported first.
void set_bf16_operands(bool on);
bool bf16_operands();

// Holds the mode for a scope and restores the previous one.
class bf16_operands_scope {
public:
  explicit bf16_operands_scope(bool on) : previous_(bf16_operands()) { set_bf16_operands(on); }
  ~bf16_operands_scope() { set_bf16_operands(previous_); }
  bf16_operands_scope(const bf16_operands_scope&) = delete;
  bf16_operands_scope& operator=(const bf16_operands_scope&) = delete;

private:
  bool previous_;
};

} // namespace dsa::cpu
