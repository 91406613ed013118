// Where a tensor lives: the CPU or one CUDA device.
#pragma once

#include "core/error.hpp"

#include <string>
#include <string_view>

namespace dsa {

enum class device_kind : std::uint8_t { cpu, cuda };

struct device {
  device_kind kind = device_kind::cpu;
  int index = 0;

  static device cpu() { return {device_kind::cpu, 0}; }
  static device cuda(int i) { return {device_kind::cuda, i}; }
  bool is_cpu() const { return kind == device_kind::cpu; }
  bool operator==(const device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const device& o) const { return !(*this == o); }
  std::string to_string() const;
};

// "cpu" or "cuda:N" (also "cuda" for cuda:0).
expected<device> parse_device(std::string_view text);

} // namespace dsa
