// Run-time ISA choice; see isa.hpp.
#include "kernels/cpu/isa.hpp"

#include "kernels/cpu/convert.hpp"

#include "core/error.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

namespace dsa::cpu {
namespace {

isa detect_cpu_isa() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return isa::avx512; // its paths use AVX2's and FMA's 256-bit forms too
  if (avx2) return isa::avx2;
#endif
  return isa::scalar;
}

bool detect_avx512_bf16() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") != 0;
#else
  return false;
#endif
}

// What DSA_CPU_ISA asks for, bounded by the hardware; `note` says what was done with it.
isa limit_from_env(isa hardware, std::string* note) {
  const char* asked = std::getenv("DSA_CPU_ISA");
  if (!asked || !*asked) return hardware;
  isa want = hardware;
  if (std::strcmp(asked, "scalar") == 0) want = isa::scalar;
  else if (std::strcmp(asked, "avx2") == 0) want = isa::avx2;
  else if (std::strcmp(asked, "avx512") == 0) want = isa::avx512;
  else {
    if (note) *note = fmt::format("DSA_CPU_ISA={} is not scalar, avx2 or avx512: ignored", asked);
    return hardware;
  }
  if (static_cast<int>(want) > static_cast<int>(hardware)) {
    if (note) *note = fmt::format("DSA_CPU_ISA={} is more than this CPU has: ignored", asked);
    return hardware;
  }
  if (note) *note = fmt::format("limited by DSA_CPU_ISA={}", asked);
  return want;
}

} // namespace

isa hardware_isa() {
  static const isa hardware = detect_cpu_isa();
  return hardware;
}

// Read once: every kernel call checks its path against it (check_path).
isa best_isa() {
  static const isa best = limit_from_env(hardware_isa(), nullptr);
  return best;
}

bool cpu_has_avx512_bf16() {
  // A limit below AVX-512 hides the extension too, as on a CPU without AVX-512.
  static const bool has = best_isa() == isa::avx512 && detect_avx512_bf16();
  return has;
}

isa active_isa() { return best_isa(); }

void check_path(isa path, const char* who) {
  DSA_CHECK(static_cast<int>(path) <= static_cast<int>(best_isa()), "{}: the {} path on a CPU whose best is {}", who,
            isa_name(path), isa_name(best_isa()));
}

const char* isa_name(isa i) {
  switch (i) {
    case isa::avx512: return "avx512";
    case isa::avx2: return "avx2";
    default: return "scalar";
  }
}

std::string isa_report() {
  std::string note;
  const isa chosen = limit_from_env(hardware_isa(), &note);
  const bool bf16_instruction = chosen == isa::avx512 && bf16_conversion_instructions();
  return fmt::format("vector kernels: {} (this CPU has {}{}{}){}", isa_name(chosen), isa_name(hardware_isa()),
                     detect_avx512_bf16() ? " with AVX512_BF16" : "", note.empty() ? "" : "; " + note,
                     bf16_instruction ? ", f32 to bf16 by AVX512_BF16's vcvtne2ps2bf16" : "");
}

} // namespace dsa::cpu
