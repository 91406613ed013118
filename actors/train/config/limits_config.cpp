// The [limits] section and byte sizes; see limits_config.hpp.
#include "actors/train/config/limits_config.hpp"

#include "optim/param_reader.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <exception>
#include <string>

namespace dsa::train {

std::optional<std::int64_t> parse_byte_size(std::string_view text) {
  std::string s(text);
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  double number = 0;
  try {
    std::size_t used = 0;
    number = std::stod(s.substr(0, i), &used);
    if (used != i) return std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
  while (i < s.size() && s[i] == ' ') ++i;
  const std::string unit = s.substr(i);
  struct named {
    const char* name;
    double factor;
  };
  static const named units[] = {{"", 1},          {"B", 1},         {"KiB", 1024.0},   {"MiB", 1048576.0},
                                {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6},
                                {"GB", 1e9},      {"TB", 1e12}};
  for (const auto& u : units)
    if (unit == u.name) {
      const double bytes = std::floor(number * u.factor);
      if (!(bytes >= 1 && bytes < 9e18)) return std::nullopt;
      return static_cast<std::int64_t>(bytes);
    }
  return std::nullopt;
}

std::string format_bytes(std::int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (std::int64_t{1} << 30)) return fmt::format("{:.2f} GiB", b / (1 << 30));
  if (bytes >= (std::int64_t{1} << 20)) return fmt::format("{:.2f} MiB", b / (1 << 20));
  if (bytes >= 1024) return fmt::format("{:.2f} KiB", b / 1024);
  return fmt::format("{} B", bytes);
}

namespace {
// [limits] `key`: a size string or a positive number of bytes into `out`; errors name the key.
void read_size(const config& cfg, optim::param_reader& r, config_problems& problems, const char* key,
               std::int64_t& out) {
  const toml::node* node = cfg.table().at_path(std::string("limits.") + key).node();
  if (node && node->is_integer()) {
    r.read(key, out);
    if (out < 1) r.invalid(key, fmt::format("must be a positive size, got {}", out));
    return;
  }
  std::string text;
  const std::size_t before = problems.size();
  r.read(key, text);
  if (!node || problems.size() != before) return;
  if (auto bytes = parse_byte_size(text)) out = *bytes;
  else
    r.invalid(key, fmt::format("expected a size such as \"2GiB\", \"512MiB\", \"3GB\" or a number of bytes, got "
                               "\"{}\" (K, M, G and T alone are ambiguous: write KiB or KB)",
                               text));
}
} // namespace

void read_limits(const config& cfg, run_config& rc, config_problems& problems) {
  optim::param_reader r(cfg, "limits", problems);
  read_size(cfg, r, problems, "host_memory", rc.host_memory);
  read_size(cfg, r, problems, "device_memory", rc.device_memory);
  r.read("gradient_partition", rc.gradient_partition);
  if (rc.gradient_partition != "auto" && rc.gradient_partition != "memory" && rc.gradient_partition != "nvme")
    r.invalid("gradient_partition",
              fmt::format("expected \"auto\", \"memory\" or \"nvme\", got \"{}\"", rc.gradient_partition));
  if (rc.gradient_partition == "nvme") {
    if (auto why = grads_to_nvme_refusal(rc)) r.invalid("gradient_partition", "\"nvme\": " + *why);
    else rc.grads_on_nvme = true;
  }
  r.check_unknown();
}

std::optional<std::string> grads_to_nvme_refusal(const run_config& rc) {
  if (!rc.gradients_partitioned())
    return fmt::format("the gradients are partitioned only with ZeRO stage 3, or stage 2 on one pipeline stage, over "
                       "ranks that reduce (got stage {} with {} pipeline stage(s)); a whole gradient stays in memory",
                       rc.zero_stage, rc.stages);
  if (!rc.offload.swaps())
    return std::string("the partition goes to the optimizer's NVMe swap folder: set "
                       "zero_optimization.offload_optimizer.device = \"nvme\" (and nvme_path)");
  const auto type = rc.optimizer.type;
  if (type != optim::optimizer_type::adam && type != optim::optimizer_type::adamw)
    return fmt::format("the update reads the partition window by window with Adam and AdamW only, not "
                       "optimizer.type = \"{}\"",
                       optim::optimizer_name(type));
  return std::nullopt;
}

} // namespace dsa::train
