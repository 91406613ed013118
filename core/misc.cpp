// Small pieces of the core vocabulary: dtype names, device parsing, memory accounting.
#include "core/device.hpp"
#include "core/dtype.hpp"
#include "core/memory_stats.hpp"

#include <atomic>
#include <charconv>

namespace dsa {

const char* dtype_name(dtype t) {
  switch (t) {
  case dtype::f32: return "f32";
  case dtype::f16: return "f16";
  case dtype::bf16: return "bf16";
  case dtype::i32: return "i32";
  case dtype::i64: return "i64";
  case dtype::u8: return "u8";
  }
  return "?";
}

expected<dtype> parse_dtype(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32" || name == "float" || name == "F32") return dtype::f32;
  if (name == "f16" || name == "fp16" || name == "float16" || name == "half" || name == "F16") return dtype::f16;
  if (name == "bf16" || name == "bfloat16" || name == "BF16") return dtype::bf16;
  if (name == "i32" || name == "int32" || name == "I32") return dtype::i32;
  if (name == "i64" || name == "int64" || name == "I64") return dtype::i64;
  if (name == "u8" || name == "uint8" || name == "U8") return dtype::u8;
  return make_error(errc::invalid_argument, "unknown dtype '{}' (expected f32, f16, bf16, i32, i64 or u8)", name);
}

std::string device::to_string() const {
  return kind == device_kind::cpu ? std::string("cpu") : fmt::format("cuda:{}", index);
}

expected<device> parse_device(std::string_view text) {
  if (text == "cpu") return device::cpu();
  if (text == "cuda") return device::cuda(0);
  if (text.substr(0, 5) == "cuda:") {
    int idx = -1;
    auto tail = text.substr(5);
    auto [p, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), idx);
    if (ec == std::errc() && p == tail.data() + tail.size() && idx >= 0) return device::cuda(idx);
  }
  return make_error(errc::invalid_argument, "unknown device '{}' (expected cpu or cuda:N)", text);
}

namespace {
struct counters {
  std::atomic<std::int64_t> current{0}, peak{0}, allocations{0};
};
counters g_counters[1 + max_tracked_cuda_devices];

counters& counters_for(device dev) {
  if (dev.is_cpu()) return g_counters[0];
  DSA_CHECK(dev.index >= 0 && dev.index < max_tracked_cuda_devices, "device index {} out of range", dev.index);
  return g_counters[1 + dev.index];
}
} // namespace

void memory_note_alloc(device dev, std::size_t bytes) {
  counters& c = counters_for(dev);
  std::int64_t now = c.current.fetch_add(static_cast<std::int64_t>(bytes)) + static_cast<std::int64_t>(bytes);
  c.allocations.fetch_add(1);
  std::int64_t peak = c.peak.load();
  while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
  }
}

void memory_note_free(device dev, std::size_t bytes) {
  counters_for(dev).current.fetch_sub(static_cast<std::int64_t>(bytes));
}

memory_usage memory_usage_of(device dev) {
  counters& c = counters_for(dev);
  return {c.current.load(), c.peak.load(), c.allocations.load()};
}

void memory_reset_peak(device dev) {
  counters& c = counters_for(dev);
  c.peak.store(c.current.load());
}

} // namespace dsa
