// The [limits] section (limits.host_memory, limits.device_memory) and the byte sizes it is written in.
#pragma once

#include "actors/train/config/run_config.hpp"
#include "core/config.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dsa::train {

// "2GiB", "512 MiB", "1.5GiB", "3GB" (10^9), "1048576" or "1048576B": bytes; none
// for anything else (a unit without i other than B, a bare K/M/G/T, zero, negative).
std::optional<std::int64_t> parse_byte_size(std::string_view text);
// "1.50 GiB", "12.00 MiB", "4096 B".
std::string format_bytes(std::int64_t bytes);

// [limits] host_memory and device_memory: a size string or a number of bytes into
// rc.host_memory and rc.device_memory (0: not given); gradient_partition ("auto", "memory", "nvme"); errors name the key.
// Read after the zero_optimization and optimizer sections.
void read_limits(const config& cfg, run_config& rc, config_problems& problems);

// Why ZeRO's gradient partition cannot live on NVMe in this run (no partitioned
// gradients, no NVMe swap folder, an optimizer that does not sweep it by windows), or
// nothing when it can.
std::optional<std::string> grads_to_nvme_refusal(const run_config& rc);

} // namespace dsa::train
