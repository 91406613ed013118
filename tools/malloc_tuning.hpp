// glibc malloc settings for the dsactor process: keep freed tensor memory for reuse instead
// of handing it back to the kernel and faulting it in again on the next step.
#pragma once

#include <string>

namespace dsa::tools {

// With glibc's defaults every large tensor (above a threshold that grows to at most 32 MiB)
// is a fresh mmap, and freed heap memory above 128 KiB at the top is trimmed: a training
// step that allocates and frees the same activations each time pays page faults and the
// kernel's zeroing for all of them. This sets M_MMAP_THRESHOLD and M_TRIM_THRESHOLD to
// 1 GiB, so blocks up to that come from the heap and freed memory stays mapped for the next
// step, and M_ARENA_MAX to 1: every thread allocates from the main arena. Other arenas'
// heaps hold at most 64 MiB, so the compute threads' larger blocks were still mapped afresh
// on every step, and each arena kept its own peak (a bf16 quick start measured 195k page
// faults and 284-288 MiB peak resident with them, 63k and 258-261 MiB with one arena, at
// the same speed).
// A run with limits.host_memory sets its own (actors/train/memory/memory_plan.cpp: blocks of 1
// MiB and more go back to the system at once, so the plan can bound the peak).
// Skipped when the user chose malloc settings (GLIBC_TUNABLES naming glibc.malloc, or
// MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_): then returns why. A user's
// MALLOC_ARENA_MAX keeps its arenas (the thresholds are still set). Returns "" when set.
std::string tune_malloc();
// One line for `dsactor report`: what tune_malloc() did in this process.
std::string malloc_tuning_report();

} // namespace dsa::tools
