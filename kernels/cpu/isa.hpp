// The instruction sets dsactor's own vector kernels choose between at run time. The build
// stays portable (x86-64-v3 at most, never -march=native): kernels with an AVX-512 path
// compile it with a per-function target attribute and call it only when cpuid says the CPU
// has it. Chosen once per process from cpuid; DSA_CPU_ISA=scalar|avx2|avx512 limits what
// the code believes the CPU has (a higher one than the CPU has is not taken), so
// DSA_CPU_ISA=avx2 behaves as an AVX2-only CPU would: no AVX-512 path, no AVX512_BF16.
#pragma once

#include <string>

// Marks a function compiled for AVX-512 (called only when active_isa() is avx512). FMA and F16C
// are named too (every AVX-512 CPU has them; GCC does not imply them from avx512f), so the
// 256-bit FMA and conversion intrinsics also compile in a baseline x86-64 build.
#define DSA_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,f16c")))
// The same with AVX512_BF16, for code called only where cpu_has_avx512_bf16().
#define DSA_AVX512_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,f16c,avx512bf16")))
// Around AVX-512 code: GCC 12's avx512fintrin.h passes _mm512_undefined_epi32() as the unused
// merge operand of unmasked intrinsics, which -Wmaybe-uninitialized reports once inlined.
#define DSA_AVX512_CODE_BEGIN _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define DSA_AVX512_CODE_END _Pragma("GCC diagnostic pop")
// Around a region whose every function is compiled for AVX-512 with 512-bit vectors
// preferred (a kernel's loops included a second time, in their own namespace). Only code
// defined inside it gets the target; keep headers included before it.
#define DSA_AVX512_REGION_BEGIN \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512dq,avx512vl,fma,f16c,prefer-vector-width=512\")")
#define DSA_AVX512_REGION_END _Pragma("GCC pop_options")

namespace dsa::cpu {

enum class isa { scalar, avx2, avx512 };

// What cpuid says: AVX2 needs AVX2 and FMA; AVX-512 needs those and F, BW, DQ and VL.
isa hardware_isa();
// The best the code may use: hardware_isa(), or lower when DSA_CPU_ISA limits it.
isa best_isa();
// Whether the CPU has AVX512_BF16 (bf16 dot products and f32 -> bf16 rounding; every AMX CPU
// has it) and best_isa() is AVX-512: a DSA_CPU_ISA limit below AVX-512 hides it.
bool cpu_has_avx512_bf16();
// The one the kernels use: best_isa().
isa active_isa();
const char* isa_name(isa i);
// A broken invariant (naming `who`) when `path` is more than the CPU has.
void check_path(isa path, const char* who);
// One line for `dsactor report` and the run log: the active ISA and why.
std::string isa_report();

} // namespace dsa::cpu
