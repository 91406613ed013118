// Allocation accounting per device: current and peak bytes held by tensors.
// Later issues print these in memory reports.
#pragma once

#include "core/device.hpp"

#include <cstddef>
#include <cstdint>

namespace dsa {

struct memory_usage {
  std::int64_t current_bytes = 0;
  std::int64_t peak_bytes = 0;
  std::int64_t allocations = 0; // number of allocations made so far
};

// Record an allocation or release of `bytes` on `dev`. Thread-safe.
void memory_note_alloc(device dev, std::size_t bytes);
void memory_note_free(device dev, std::size_t bytes);
memory_usage memory_usage_of(device dev);
// Sets peak to current (to measure the peak of one phase).
void memory_reset_peak(device dev);

constexpr int max_tracked_cuda_devices = 16;

} // namespace dsa
