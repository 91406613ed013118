// libFuzzer target: a run's TOML config as `dsactor run` reads it, then typed reads of keys
// every run reads (the conversions and the problem list).
#include "core/config.hpp"
#include "core/config_problems.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto cfg = dsa::config::parse(std::string_view(reinterpret_cast<const char*>(data), size), "<fuzz>");
  if (!cfg) return 0;
  dsa::config_problems problems;
  std::int64_t n = 0;
  double x = 0;
  bool b = false;
  std::string s;
  cfg->read("train_batch_size", n, problems);
  cfg->read("optimizer.params.lr", x, problems);
  cfg->read("fp16.enabled", b, problems);
  cfg->read("optimizer.type", s, problems);
  cfg->read("zero_optimization.stage", n, problems);
  (void)cfg->children("zero_optimization");
  (void)cfg->set_override("train_steps=3");
  (void)problems.to_status();
  return 0;
}
