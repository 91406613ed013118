// The batch-size rule, following DeepSpeed's runtime config resolution.
#include "actors/train/batch_config.hpp"

#include <fmt/format.h>

#include <optional>

namespace dsa::train {
namespace {

expected<std::optional<std::int64_t>> optional_positive(const config& cfg, const char* key) {
  if (!cfg.has(key)) return std::optional<std::int64_t>{};
  auto v = cfg.get<std::int64_t>(key);
  if (!v) return v.err();
  if (*v <= 0) return cfg.key_error(key, fmt::format("must be a positive integer, got {}", *v));
  return std::optional<std::int64_t>{*v};
}

} // namespace

expected<batch_config> resolve_batch_config(const config& cfg, std::int64_t dp) {
  DSA_ASSIGN_OR_RETURN(auto train, optional_positive(cfg, "train_batch_size"));
  DSA_ASSIGN_OR_RETURN(auto micro, optional_positive(cfg, "train_micro_batch_size_per_gpu"));
  DSA_ASSIGN_OR_RETURN(auto accum, optional_positive(cfg, "gradient_accumulation_steps"));
  batch_config b;
  b.data_parallel_size = dp;
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
    return make_error(errc::config,
                      "{}: either 'train_batch_size' or 'train_micro_batch_size_per_gpu' needs to be provided",
                      cfg.source());
  }
  if (b.micro_batch_size <= 0 || b.gradient_accumulation <= 0 ||
      b.train_batch_size != b.micro_batch_size * b.gradient_accumulation * dp) {
    return make_error(errc::config,
                      "{}: inconsistent batch keys: train_batch_size ({}) must equal "
                      "train_micro_batch_size_per_gpu ({}) x gradient_accumulation_steps ({}) x data-parallel size ({})",
                      cfg.source(), b.train_batch_size, b.micro_batch_size, b.gradient_accumulation, dp);
  }
  return b;
}

} // namespace dsa::train
