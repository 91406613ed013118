// The batch-size rule, following DeepSpeed's runtime config resolution.
#include "actors/train/config/batch_config.hpp"

#include <fmt/format.h>

#include <optional>

namespace dsa::train {
namespace {

// The key's value when present and positive; a bad value is recorded and reads as absent.
std::optional<std::int64_t> optional_positive(const config& cfg, const char* key,
                                              config_problems& problems) {
  if (!cfg.has(key))
    return std::nullopt;
  std::int64_t v = 0;
  const std::size_t before = problems.size();
  cfg.read(key, v, problems);
  if (problems.size() != before)
    return std::nullopt;
  if (v > 0)
    return v;
  problems.add(cfg.problem(problem_kind::invalid_value, key,
                           fmt::format("must be a positive integer, got {}", v)));
  return std::nullopt;
}

} // namespace

batch_config read_batch_config(const config& cfg, std::int64_t dp, config_problems& problems) {
  const std::size_t before = problems.size();
  auto train = optional_positive(cfg, "train_batch_size", problems);
  auto micro = optional_positive(cfg, "train_micro_batch_size_per_gpu", problems);
  auto accum = optional_positive(cfg, "gradient_accumulation_steps", problems);
  batch_config b;
  b.data_parallel_size = dp;
  if (problems.size() != before)
    return b; // the rule is not applied to values already reported
  if (train && micro && accum) {
    b = {*train, *micro, *accum, dp};
  } else if (train && micro) {
    b = {*train, *micro, *train / *micro / dp, dp};
  } else if (train && accum) {
    b = {*train, *train / dp / *accum, *accum, dp};
  } else if (micro && accum) {
    b = {*micro * *accum * dp, *micro, *accum, dp};
  } else if (train) {
    b = {*train, *train / dp, 1, dp};
  } else if (micro) {
    b = {*micro * dp, *micro, 1, dp};
  } else {
    problems.add(cfg.problem(
        problem_kind::missing_key, "train_batch_size",
        "either 'train_batch_size' or 'train_micro_batch_size_per_gpu' needs to be provided"));
    return b;
  }
  if (b.micro_batch_size <= 0 || b.gradient_accumulation <= 0 ||
      b.train_batch_size != b.micro_batch_size * b.gradient_accumulation * dp) {
    problems.add(cfg.problem(
        problem_kind::invalid_value, "train_batch_size",
        fmt::format("inconsistent batch keys: train_batch_size ({}) must equal "
                    "train_micro_batch_size_per_gpu ({}) "
                    "x gradient_accumulation_steps ({}) x data-parallel size ({})",
                    b.train_batch_size, b.micro_batch_size, b.gradient_accumulation, dp)));
  }
  return b;
}

expected<batch_config> resolve_batch_config(const config& cfg, std::int64_t dp) {
  config_problems problems;
  batch_config b = read_batch_config(cfg, dp, problems);
  DSA_TRY(problems.to_status());
  return b;
}

} // namespace dsa::train
